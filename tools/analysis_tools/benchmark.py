"""Inference throughput (images/s) of the model a config builds, on the CPU or a GPU.

The network's forward (the tensor-mode forward: classifier logits, the
detector's / segmentor's backbone, neck and heads without post-processing, the
SR output; for a DiT config one denoising step of the noise predictor on
latents) runs on random inputs that are already normalised (the data pipeline
and preprocessor are not timed). ``--warmup`` untimed iterations come first
(kernel selection, Triton compilation, caches), then ``--repeat`` timed ones,
each synchronised on CUDA. Reported: median / mean / std / min time per
iteration, throughput ``batch / median time`` and, on CUDA, the peak memory
of the timed iterations.

Default input sizes (``--shape`` overrides): classification 224x224,
detection 800x1280, segmentation 512x2048, super-resolution a 180x320 LR
image (x scale out), DiT its configured latent size.

A progress bar over the iterations goes to stderr when it is a terminal
(``--no-progress`` or ``POLAPP_NO_PROGRESS=1``: none; it is drawn between the
timed calls, outside the timed region); the results go to stdout.

Examples::

    python tools/analysis_tools/benchmark.py configs/classification/polapp-b2_8xb256_in1k.py --batch-size 64
    python tools/analysis_tools/benchmark.py CONFIG --device cpu --threads 4 --repeat 5
    python tools/analysis_tools/benchmark.py CONFIG --checkpoint CKPT --amp bf16 --out-json bench.json
"""
import argparse
import contextlib
import json
import os.path as osp
import statistics
import time

import torch
from mmengine.config import Config, DictAction

from polaformerpp.analysis import load_model
from polaformerpp.utils.checkpoint import ALLOW_PARTIAL_HELP, UNSAFE_LOAD_HELP, exit_on_checkpoint_error
from polaformerpp.utils.cli import image_shape, non_negative_int, parser_errors, positive_int, run_cli, torch_device
from polaformerpp.utils.progress import ProgressBar, add_progress_argument, progress_from_args

DEFAULT_SHAPES = dict(mmpretrain=(224, 224), mmdet=(800, 1280), mmseg=(512, 2048))
SR_DEFAULT_SHAPE = (180, 320)  # a 1280x720 output at x4
AMP_DTYPES = dict(fp16=torch.float16, bf16=torch.bfloat16)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Measure the inference throughput of a config')
    parser.add_argument('config', help='config file path')
    parser.add_argument('--checkpoint', help='checkpoint to load (default: the initial weights)')
    parser.add_argument('--allow-partial', action='store_true', help=ALLOW_PARTIAL_HELP)
    parser.add_argument('--unsafe-load', action='store_true', help=UNSAFE_LOAD_HELP)
    parser.add_argument('--shape', type=int, nargs='+', default=None, help='input H W (or one size)')
    parser.add_argument('--batch-size', type=positive_int, default=1)
    parser.add_argument('--device', type=torch_device, default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--amp', choices=sorted(AMP_DTYPES), default=None, help='autocast dtype')
    parser.add_argument('--warmup', type=non_negative_int, default=5, help='untimed iterations first')
    parser.add_argument('--repeat', type=positive_int, default=20, help='timed iterations')
    parser.add_argument('--threads', type=positive_int, default=None,
                        help='CPU threads (torch.set_num_threads)')
    parser.add_argument('--out-json', help='write the measurements to this JSON file')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config entries')
    add_progress_argument(parser)
    args = parser.parse_args(argv)
    with parser_errors(parser):
        args.shape = image_shape(args.shape)
    if not osp.isfile(args.config):
        parser.error(f'config: {args.config} not found')
    if args.checkpoint is not None and not osp.isfile(args.checkpoint):
        parser.error(f'--checkpoint: {args.checkpoint} not found')
    return args


def _data_samples(scope, shape, batch):
    """Per-image meta information that detectors/segmentors read in tensor mode."""
    h, w = shape
    meta = dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w), batch_input_shape=(h, w),
                scale_factor=(1.0, 1.0))
    if scope == 'mmdet':
        from mmdet.structures import DetDataSample
        return [DetDataSample(metainfo=meta) for _ in range(batch)]
    if scope == 'mmseg':
        from mmseg.structures import SegDataSample
        return [SegDataSample(metainfo=meta) for _ in range(batch)]
    return None


def build_forward(model, scope, shape, batch, device):
    """``(forward(), description)``: a closure running one batch through the network."""
    if hasattr(model, 'dit'):
        dit = model.dit
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(batch, dit.in_channels, *dit.input_size, generator=generator).to(device)
        t = torch.randint(0, 1000, (batch, ), generator=generator).to(device)
        y = torch.randint(0, dit.num_classes, (batch, ), generator=generator).to(device)
        return (lambda: dit(x, t, y)), f'DiT step on latents {tuple(x.shape[1:])}'
    inputs = torch.randn(batch, 3, *shape, generator=torch.Generator().manual_seed(0)).to(device)
    described = f'input {tuple(inputs.shape[1:])}'
    if scope in ('mmdet', 'mmseg'):
        samples = _data_samples(scope, shape, batch)
        return (lambda: model(inputs, samples, mode='tensor')), described
    if scope == 'mmpretrain':
        return (lambda: model(inputs, mode='tensor')), described
    return (lambda: model(inputs)), described


def default_shape(cfg, scope):
    if scope in DEFAULT_SHAPES:
        return DEFAULT_SHAPES[scope]
    if 'upscale' in cfg.model.get('network', {}):
        return SR_DEFAULT_SHAPE
    return (224, 224)


def benchmark(config, checkpoint=None, shape=None, batch_size=1, device='cpu', amp=None, warmup=5,
              repeat=20, cfg_options=None, progress=False, allow_partial=False,
              unsafe_load=False):
    """Time the network of ``config``; returns a dict of the measurements (seconds, images/s).

    ``progress``: a bar over the warm-up and timed iterations on stderr (``False`` none,
    ``None`` when stderr is a terminal, ``True`` always). ``allow_partial`` / ``unsafe_load``:
    see :func:`polaformerpp.analysis.load_model` (the checkpoint loads strictly and safely by default).
    """
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    scope = cfg.get('default_scope', None)
    shape = tuple(shape) if shape is not None else default_shape(cfg, scope)
    model = load_model(cfg, checkpoint, device=device, allow_partial=allow_partial, unsafe_load=unsafe_load)
    forward, described = build_forward(model, scope, shape, batch_size, device)
    cuda = str(device).startswith('cuda')

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    autocast = (torch.autocast(device_type='cuda' if cuda else 'cpu', dtype=AMP_DTYPES[amp])
                if amp else contextlib.nullcontext())
    times = []
    title = f'{warmup} warm-up + {repeat} timed iterations'
    with torch.no_grad(), autocast, ProgressBar(warmup + repeat, title, enabled=progress) as bar:
        for _ in range(warmup):
            forward()
            bar.update()
        sync()
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        for _ in range(repeat):
            sync()
            start = time.perf_counter()
            forward()
            sync()
            times.append(time.perf_counter() - start)
            bar.update()
    median = statistics.median(times)
    result = dict(config=config, checkpoint=checkpoint, device=str(device), amp=amp, batch_size=batch_size,
                  input=described, warmup=warmup, repeat=repeat, median_s=median,
                  mean_s=statistics.fmean(times), std_s=statistics.pstdev(times), min_s=min(times),
                  images_per_s=batch_size / median, params=sum(p.numel() for p in model.parameters()))
    if cuda:
        result['peak_memory_mib'] = torch.cuda.max_memory_allocated(device) / 2**20
        result['device_name'] = torch.cuda.get_device_name(device)
    return result


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = benchmark(args.config, args.checkpoint, args.shape, args.batch_size, args.device, args.amp,
                       args.warmup, args.repeat, args.cfg_options, progress=progress_from_args(args),
                       allow_partial=args.allow_partial, unsafe_load=args.unsafe_load)
    device = result.get('device_name', result['device'])
    if not result['device'].startswith('cuda'):
        device += f' ({torch.get_num_threads()} threads)'
    print(f"{osp.basename(args.config)}: {result['input']}, batch {args.batch_size}, {device}, "
          f"{args.amp or 'fp32'}, {result['params'] / 1e6:.2f}M params")
    print(f"time/iter: median {result['median_s'] * 1e3:.2f} ms, mean {result['mean_s'] * 1e3:.2f} "
          f"+- {result['std_s'] * 1e3:.2f} ms, min {result['min_s'] * 1e3:.2f} ms "
          f"({args.warmup} warm-up + {args.repeat} timed)")
    line = f"throughput: {result['images_per_s']:.2f} images/s"
    if 'peak_memory_mib' in result:
        line += f", peak memory {result['peak_memory_mib']:.0f} MiB"
    print(line)
    if args.out_json:
        with open(args.out_json, 'w') as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == '__main__':
    exit_on_checkpoint_error(lambda argv: run_cli(main, argv))
