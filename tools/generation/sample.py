"""Sample class-conditional images from a trained DiT (single process or torchrun).

Writes ``OUT/samples_<N>x<H>x<W>x3.npz`` (``arr_0``: uint8 ``(N, H, W, 3)``,
exactly N samples gathered from all processes in sample order, ``arr_1``:
int64 labels; an uncompressed ``.npz``, the layout the ADM / guided-diffusion
evaluator, ``evaluations/evaluator.py``, reads) and PNG grids
``OUT/grid_<k>.png`` of the first samples. Without ``--labels`` the labels are
drawn uniformly at random from ``--seed``, as DiT's FID sampler draws them.

Sample ``i`` uses noise seeded by ``(seed, i)``, so a run gives the same images
whatever the batch size or number of processes (up to floating-point
reduction order).

Rank 0 shows a progress bar over all processes' samples on stderr when it is a
terminal (``--no-progress`` or ``POLAPP_NO_PROGRESS=1``: none; in logs a line
per batch instead). Impossible arguments (``--num-samples 0``, ``--steps 0``,
``--cfg-scale`` below 1, labels outside the model's classes, missing files)
end with a message naming the argument and exit code 2.

Examples::

    python tools/generation/sample.py CONFIG CKPT --out-dir samples --num-samples 64 \\
        --labels 207 360 387 974 88 979 417 279 --cfg-scale 4.0 --steps 250
    torchrun --nproc_per_node 8 tools/generation/sample.py CONFIG CKPT --launcher pytorch \\
        --out-dir fid50k --num-samples 50000             # FID-50K: the config's protocol
"""
import argparse
import math
import os
import os.path as osp
import shutil

import numpy as np
import torch
import torch.distributed as dist
from mmengine.config import Config, DictAction
from mmengine.registry import MODELS, init_default_scope
from mmengine.utils import import_modules_from_strings
from PIL import Image

from polaformerpp.utils.checkpoint import (
    ALLOW_PARTIAL_HELP,
    UNSAFE_LOAD_HELP,
    exit_on_checkpoint_error,
    load_model_weights,
)
from polaformerpp.utils.cli import (
    ArgumentCheckError,
    MissingPathError,
    non_negative_float,
    non_negative_int,
    positive_int,
    run_cli,
)
from polaformerpp.utils.progress import ProgressBar, add_progress_argument, progress_enabled, progress_from_args


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Sample images from a class-conditional DiT')
    parser.add_argument('config', help='config file of the model')
    parser.add_argument('checkpoint', help='checkpoint (its state_dict holds the EMA weights '
                        'when trained with the EMA hook)')
    parser.add_argument('--allow-partial', action='store_true', help=ALLOW_PARTIAL_HELP)
    parser.add_argument('--unsafe-load', action='store_true', help=UNSAFE_LOAD_HELP)
    parser.add_argument('--out-dir', required=True, help='folder for the .npz and the PNG grids')
    parser.add_argument('--num-samples', type=positive_int, default=None,
                        help='number of samples (default: number of --labels, else 64)')
    parser.add_argument('--labels', nargs='+', type=non_negative_int, default=None,
                        help='class labels, repeated cyclically up to --num-samples '
                        '(default: uniformly random labels drawn from --seed)')
    parser.add_argument('--cfg-scale', type=float, default=None,
                        help='classifier-free guidance scale (1 = none; default from the config)')
    parser.add_argument('--steps', type=positive_int, default=None,
                        help='sampling steps (respaced; default from the config)')
    parser.add_argument('--sampler', choices=['ddpm', 'ddim'], default=None)
    parser.add_argument('--eta', type=non_negative_float, default=None, help='DDIM eta')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--batch-size', type=positive_int, default=32,
                        help='samples per forward, per process (DiT\'s sampler: 32)')
    parser.add_argument('--grid-nrow', type=positive_int, default=8, help='images per grid row')
    parser.add_argument('--grid-size', type=positive_int, default=64, help='images per PNG grid')
    parser.add_argument('--num-grids', type=non_negative_int, default=1, help='PNG grids to write (0: none)')
    parser.add_argument('--device', default=None, help="default: 'cuda' if available, else 'cpu'")
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, e.g. model.sample_cfg.clip_denoised=False')
    parser.add_argument('--launcher', choices=['none', 'pytorch'], default='none',
                        help="'pytorch' under torchrun (NCCL on GPUs, gloo on CPUs)")
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    add_progress_argument(parser)
    args = parser.parse_args(argv)
    check_args(args)
    return args


def check_args(args) -> None:
    """Checks of the parsed arguments (called by :func:`parse_args`; the ``type=`` checks come first).

    Raises:
        ArgumentCheckError: a ``ValueError`` naming the argument (``MissingPathError``, also a
            ``FileNotFoundError``, for the files); the command line exits with code 2.
    """
    if args.num_samples is None:
        args.num_samples = len(args.labels) if args.labels else 64
    for option, value in (('--num-samples', args.num_samples), ('--batch-size', args.batch_size)):
        if value < 1:
            raise ArgumentCheckError(f'{option} must be >= 1, got {value}')
    if args.cfg_scale is not None and not 1 <= args.cfg_scale < float('inf'):
        raise ArgumentCheckError(f'--cfg-scale must be >= 1 (1 disables guidance), got {args.cfg_scale}')
    if args.steps is not None and args.steps < 1:
        raise ArgumentCheckError(f'--steps must be >= 1, got {args.steps}')
    if args.eta is not None and args.eta < 0:
        raise ArgumentCheckError(f'--eta must be >= 0, got {args.eta}')
    if not osp.isfile(args.config):
        raise MissingPathError(f'config not found: {args.config}')
    if not osp.isfile(args.checkpoint):
        raise MissingPathError(f'checkpoint not found: {args.checkpoint}')


def setup_distributed(launcher: str):
    """``(rank, world_size, device)``; initialises the process group under torchrun."""
    if launcher == 'none':
        return 0, 1, None
    rank, world = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
    if torch.cuda.is_available():
        local_rank = int(os.environ.get('LOCAL_RANK', 0))
        torch.cuda.set_device(local_rank)
        dist.init_process_group('nccl', rank=rank, world_size=world)
        return rank, world, torch.device('cuda', local_rank)
    dist.init_process_group('gloo', rank=rank, world_size=world)
    return rank, world, torch.device('cpu')


def build_model(config: str, checkpoint: str, cfg_options=None, device='cpu', allow_partial=False,
                unsafe_load=False):
    """Build ``cfg.model`` (an :class:`~polaformerpp.generation.DiTDiffusion`) and load weights.

    The checkpoint loads safely (``unsafe_load``: full unpickling of a trusted
    file) and strictly (``allow_partial``: proceed with unfilled tensors);
    see :func:`polaformerpp.utils.load_model_weights`.
    """
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if cfg.get('custom_imports'):
        import_modules_from_strings(**cfg.custom_imports)
    import polaformerpp.generation  # noqa: F401  (registers the generation modules)
    init_default_scope(cfg.get('default_scope', 'mmengine') or 'mmengine')
    model = MODELS.build(cfg.model)
    if not hasattr(model, 'sample'):
        raise TypeError(f'{config}: model {type(model).__name__} has no sample() method '
                        f'(expected a DiTDiffusion config)')
    load_model_weights(model, checkpoint, allow_partial=allow_partial, unsafe=True if unsafe_load else None)
    return model.to(device).eval()


def resolve_labels(args, num_classes: int) -> np.ndarray:
    if args.labels:
        bad = [y for y in args.labels if not 0 <= y < num_classes]
        if bad:
            raise ArgumentCheckError(f'--labels must be in [0, {num_classes - 1}] (the model has '
                                     f'{num_classes} classes), got {bad}')
        return np.resize(np.asarray(args.labels, np.int64), args.num_samples)
    from polaformerpp.generation import random_class_labels
    return random_class_labels(args.num_samples, num_classes, args.seed)


def samples_done(num_samples: int, world: int, batch_size: int, batches: int) -> int:
    """Samples all ``world`` processes have made after ``batches`` batches each (rank ``r`` takes
    the indices ``r, r + world, ...``)."""
    return sum(min(batches * batch_size, len(range(r, num_samples, world))) for r in range(world))


def main(argv=None):
    args = parse_args(argv)
    rank, world, device = setup_distributed(args.launcher)
    if device is None:
        device = torch.device(args.device or ('cuda' if torch.cuda.is_available() else 'cpu'))
    from polaformerpp.generation import make_grid, sample_generators

    model = build_model(args.config, args.checkpoint, args.cfg_options, device, args.allow_partial, args.unsafe_load)
    labels = resolve_labels(args, model.dit.num_classes)
    my_indices = np.arange(rank, args.num_samples, world)
    chunks = []
    num_batches = math.ceil(len(my_indices) / args.batch_size)
    # rank 0 draws one bar over all processes' samples (they run in step: same batch count +- 1)
    show = rank == 0 and progress_enabled(progress_from_args(args))
    what = f'sampling {args.num_samples} images' + (f' on {world} processes' if world > 1 else '')
    with ProgressBar(args.num_samples, what, enabled=show) as bar:
        for b in range(num_batches):
            idx = my_indices[b * args.batch_size:(b + 1) * args.batch_size]
            fakes = model.sample(torch.from_numpy(labels[idx]), num_steps=args.steps,
                                 sampler=args.sampler, cfg_scale=args.cfg_scale, eta=args.eta,
                                 generator=sample_generators(args.seed, idx))
            chunks.append(fakes.permute(0, 2, 3, 1).numpy())
            if show:
                bar.update(samples_done(args.num_samples, world, args.batch_size, b + 1) - bar.completed)
            elif rank == 0:
                print(f'[rank 0] batch {b + 1}/{num_batches} done', flush=True)
    images = np.concatenate(chunks) if chunks else None

    os.makedirs(args.out_dir, exist_ok=True)
    if world > 1:
        shard_dir = osp.join(args.out_dir, '.shards')
        os.makedirs(shard_dir, exist_ok=True)
        if images is not None:
            np.savez(osp.join(shard_dir, f'rank{rank}.npz'), images=images, indices=my_indices)
        dist.barrier()
        if rank == 0:
            parts = [np.load(osp.join(shard_dir, f'rank{r}.npz'))
                     for r in range(world) if r < args.num_samples]
            first = parts[0]['images']
            merged = np.zeros((args.num_samples, *first.shape[1:]), np.uint8)
            for part in parts:
                merged[part['indices']] = part['images']
            images = merged
            shutil.rmtree(shard_dir)
        dist.barrier()
    out_file = None
    if rank == 0:
        n, h, w, _ = images.shape
        out_file = osp.join(args.out_dir, f'samples_{n}x{h}x{w}x3.npz')
        np.savez(out_file, arr_0=images, arr_1=labels)
        for k in range(min(args.num_grids, math.ceil(n / args.grid_size))):
            grid = make_grid(images[k * args.grid_size:(k + 1) * args.grid_size], args.grid_nrow)
            Image.fromarray(grid).save(osp.join(args.out_dir, f'grid_{k:03d}.png'))
        print(f'wrote {n} samples ({h}x{w}, labels {labels[:8].tolist()}...) to {out_file}', flush=True)
    if world > 1:
        dist.destroy_process_group()
    return out_file


if __name__ == '__main__':
    exit_on_checkpoint_error(lambda argv: run_cli(main, argv))
