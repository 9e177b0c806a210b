"""Label-swap gap of a class-conditional DiT checkpoint: does the model use its label?

For held-out images of the config's dataset, the denoising loss (noise MSE)
at fixed timesteps with the right label, a wrong label (another class, drawn
per image) and the null label (classifier-free guidance's unconditional
branch), all three on the same noisy image ``x_t``. A model that conditions
denoises better with the right label: ``gap = wrong - right > 0``, most at
the middle and high timesteps where the noisy image alone leaves the class
open. Equal losses mean the label does not reach the network. Also printed:
the scales that meet in ``c = t_emb + y_emb`` (timestep embedding norm per
timestep, label embedding norm and distance between classes) and how much
the label moves the first block's adaLN output.

Outputs: the table on stdout, ``--out-csv`` (one row per timestep) and
``--out-json`` (rows and scales). Works on any ``DiTDiffusion`` config (a
latent one needs its VAE folder to encode the images).

Examples::

    python tools/analysis_tools/label_swap_gap.py CONFIG CHECKPOINT
    python tools/analysis_tools/label_swap_gap.py CONFIG CHECKPOINT --data-root data/demo_digits32 \\
        --timesteps 100 300 500 700 900 --num-images 256 --out-json gap.json
"""
import argparse
import csv
import json
import os
import os.path as osp

import numpy as np
import torch
from mmengine.config import DictAction

from polaformerpp.utils.checkpoint import ALLOW_PARTIAL_HELP, UNSAFE_LOAD_HELP, exit_on_checkpoint_error
from polaformerpp.utils.cli import (
    ArgumentCheckError,
    existing_file,
    non_negative_int,
    positive_int,
    run_cli,
    torch_device,
)

SPLITS = ('test', 'val', 'train')
DEFAULT_TIMESTEPS = (50, 100, 300, 500, 700, 900)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Label-swap gap of a class-conditional DiT checkpoint')
    parser.add_argument('config', help='DiTDiffusion config file')
    parser.add_argument('checkpoint', help='checkpoint (its state_dict holds the EMA weights when trained '
                        'with the EMA hook)')
    parser.add_argument('--data-root', default=None, help="override the split's dataset.data_root")
    parser.add_argument('--split', choices=SPLITS, default='test',
                        help='images of <split>_dataloader.dataset (default test: held-out images)')
    parser.add_argument('--timesteps', nargs='+', type=non_negative_int, default=list(DEFAULT_TIMESTEPS),
                        help='timesteps of the training chain')
    parser.add_argument('--num-images', type=positive_int, default=256,
                        help='images drawn (without replacement, from --seed) from the split')
    parser.add_argument('--seed', type=int, default=0, help='image subset, noise and wrong labels')
    parser.add_argument('--batch-size', type=positive_int, default=64)
    parser.add_argument('--device', type=torch_device, default=None,
                        help="default: 'cuda' if available, else 'cpu'")
    parser.add_argument('--out-csv', default=None, help='write the table as CSV')
    parser.add_argument('--out-json', default=None, help='write the rows and the scales as JSON')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, e.g. model.dit.num_classes=10')
    parser.add_argument('--allow-partial', action='store_true', help=ALLOW_PARTIAL_HELP)
    parser.add_argument('--unsafe-load', action='store_true', help=UNSAFE_LOAD_HELP)
    args = parser.parse_args(argv)
    existing_file(args.config, 'config')
    existing_file(args.checkpoint, 'checkpoint')
    return args


def build_dataset(cfg, split: str, data_root=None):
    """The ``<split>_dataloader.dataset`` of ``cfg`` without random flips, ``data_root`` overridden."""
    from mmengine.registry import DATASETS
    loader = cfg.get(f'{split}_dataloader')
    if not loader or not loader.get('dataset'):
        available = [s for s in SPLITS if cfg.get(f'{s}_dataloader')]
        raise ArgumentCheckError(f'--split {split}: the config has no {split}_dataloader.dataset '
                                 f'(it has {available})')
    dataset_cfg = dict(loader['dataset'])
    if data_root is not None:
        if not osp.isdir(data_root):
            raise ArgumentCheckError(f'--data-root: folder {data_root} not found')
        dataset_cfg['data_root'] = data_root
    dataset_cfg.update(random_flip=False, test_mode=True)
    return DATASETS.build(dataset_cfg)


def load_images(dataset, num_images: int, seed: int):
    """``num_images`` items drawn without replacement: uint8 ``(N, 3, H, W)`` and labels ``(N,)``."""
    count = min(num_images, len(dataset))
    order = np.sort(np.random.default_rng(seed).permutation(len(dataset))[:count])
    items = [dataset[int(i)] for i in order]
    images = torch.stack([item['inputs'] for item in items])
    labels = torch.as_tensor([int(item['data_samples']['gt_label']) for item in items])
    return images, labels


def label_swap_report(config, checkpoint, data_root=None, split='test', timesteps=DEFAULT_TIMESTEPS,
                      num_images=256, seed=0, batch_size=64, device=None, cfg_options=None,
                      allow_partial=False, unsafe_load=False) -> dict:
    """Rows of :func:`polaformerpp.generation.label_swap_gap` and the conditioning scales of a checkpoint."""
    from polaformerpp.apis.generation import init_generator
    from polaformerpp.generation import conditioning_scales, label_swap_gap

    device = device or ('cuda' if torch.cuda.is_available() else 'cpu')
    model = init_generator(config, checkpoint, device, cfg_options, allow_partial, unsafe_load)
    T = model.diffusion.num_timesteps
    bad = [t for t in timesteps if not 0 <= t < T]
    if bad:
        raise ArgumentCheckError(f'--timesteps must be in [0, {T - 1}] (the training chain), got {bad}')
    if model.dit.num_classes < 2:
        raise ArgumentCheckError('the label-swap gap needs a model with at least 2 classes, '
                                 f'got num_classes={model.dit.num_classes}')
    dataset = build_dataset(model.cfg, split, data_root)
    images, labels = load_images(dataset, num_images, seed)
    if labels.numel() and (labels.min() < 0 or labels.max() >= model.dit.num_classes):
        raise ArgumentCheckError(f'the {split} images have labels {int(labels.min())}..{int(labels.max())} but '
                                 f'the model has {model.dit.num_classes} classes (set model.dit.num_classes '
                                 f'with --cfg-options)')
    rows = label_swap_gap(model, images, labels, list(timesteps), seed=seed, batch_size=batch_size)
    scales = conditioning_scales(model.dit, list(timesteps))
    return dict(config=str(config), checkpoint=str(checkpoint), split=split, num_images=int(labels.numel()),
                seed=seed, rows=rows, scales=scales)


def format_scales(scales: dict) -> str:
    t_norms = ', '.join(f'{t}: {n:.2f}' for t, n in zip(scales['timesteps'], scales['t_emb_norm']))
    return (f'|t_emb| per timestep: {t_norms}\n'
            f"|y_emb| mean over classes: {scales['y_emb_norm']:.3f}   |y_i - y_j| mean: "
            f"{scales['y_emb_class_diff']:.3f}   |y_null|: {scales['null_emb_norm']:.3f}\n"
            f"first block adaLN change between classes: {100 * scales['adaln_label_change']:.2f}%")


def write_csv(path: str, rows) -> None:
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    with open(path, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main(argv=None):
    args = parse_args(argv)
    from polaformerpp.generation import format_gap_table

    report = label_swap_report(args.config, args.checkpoint, args.data_root, args.split, args.timesteps,
                               args.num_images, args.seed, args.batch_size, args.device, args.cfg_options,
                               args.allow_partial, args.unsafe_load)
    print(f"label-swap gap, {report['num_images']} {args.split} images (noise MSE; gap = wrong - right):")
    print(format_gap_table(report['rows']))
    print(format_scales(report['scales']))
    if args.out_csv:
        write_csv(args.out_csv, report['rows'])
    if args.out_json:
        os.makedirs(osp.dirname(osp.abspath(args.out_json)), exist_ok=True)
        with open(args.out_json, 'w') as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == '__main__':
    exit_on_checkpoint_error(lambda argv: run_cli(main, argv))
