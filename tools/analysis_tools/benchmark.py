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

Comparison with other backbones (``--compare`` / ``--resolutions``): the
dense backbone of CONFIG (``cfg.model.backbone`` with the four stage outputs,
``out_indices=(0, 1, 2, 3)``) is timed twice, with the config's stage mix of
attention types and with linear attention in every stage, next to the named
peers, mmpretrain's own backbones with their four stage outputs too
(``swin-t/s/b``: ``SwinTransformer``, window 7, ``pad_small_map``; ``convnext-t/s/b``:
``ConvNeXt``), on square inputs of each resolution, for each of ``--modes``
(``inference``: ``no_grad``, eval mode; ``train``: train mode, forward and
backward). All models are timed in interleaved rounds (each round runs every
model once, then one fp32 2048 x 2048 matrix product measuring the machine's
rate; medians over the rounds). Per cell: median latency, the MACs of the step
(mmengine's counter, the same for every network; a training step counts three
forwards), the efficiency ``2 x MACs / latency / sgemm rate`` (1.0 is the
matrix-multiply limit of this machine) and the peak memory the step allocates
on top of the weights and the input (CUDA: ``max_memory_allocated``; CPU: the
PyTorch profiler's allocation events, i.e. tensors; a cell that runs out of
memory reads ``OOM``). ``--profile`` adds the profiler's operator table of one
step per cell. Results: tables on stdout, the speed-up of each PolaFormer++
variant over each peer and over the fastest one, ``benchmark_compare.csv`` and
``benchmark_compare.png`` (latency and memory against resolution, log-log) in
``--out-dir``. Random weights: speed does not depend on them.

Examples::

    python tools/analysis_tools/benchmark.py configs/classification/polapp-b2_8xb256_in1k.py --batch-size 64
    python tools/analysis_tools/benchmark.py CONFIG --device cpu --threads 4 --repeat 5
    python tools/analysis_tools/benchmark.py CONFIG --checkpoint CKPT --amp bf16 --out-json bench.json
    python tools/analysis_tools/benchmark.py configs/detection/mask-rcnn_polapp-b2_fpn_8xb2-amp-1x_coco.py \\
        --compare swin-t convnext-t --resolutions 224 512 1024 2048 --device cpu --threads 2 \\
        --modes inference train --profile
"""
import argparse
import contextlib
import copy
import csv
import json
import os
import os.path as osp
import statistics
import time

import torch
from mmengine.config import Config, DictAction

from polaformerpp.analysis import load_model, sgemm_gflops, sgemm_seconds, timed_calls
from polaformerpp.utils.checkpoint import ALLOW_PARTIAL_HELP, UNSAFE_LOAD_HELP, exit_on_checkpoint_error
from polaformerpp.utils.cli import (
    ArgumentCheckError,
    image_shape,
    non_negative_int,
    parser_errors,
    positive_int,
    run_cli,
    torch_device,
)
from polaformerpp.utils.progress import ProgressBar, add_progress_argument, progress_from_args

DEFAULT_SHAPES = dict(mmpretrain=(224, 224), mmdet=(800, 1280), mmseg=(512, 2048))
SR_DEFAULT_SHAPE = (180, 320)  # a 1280x720 output at x4
AMP_DTYPES = dict(fp16=torch.float16, bf16=torch.bfloat16)
#: ``--compare`` names: mmpretrain's backbones (type, arch) with their four stage outputs
PEERS = {
    'swin-t': ('SwinTransformer', 'tiny'), 'swin-s': ('SwinTransformer', 'small'),
    'swin-b': ('SwinTransformer', 'base'),
    'convnext-t': ('ConvNeXt', 'tiny'), 'convnext-s': ('ConvNeXt', 'small'), 'convnext-b': ('ConvNeXt', 'base'),
}
DEFAULT_RESOLUTIONS = (224, 512, 1024)
#: --warmup / --repeat of the comparison when not given (seconds per forward at 2048^2 on a CPU)
COMPARE_WARMUP, COMPARE_REPEAT = 1, 5


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
    parser.add_argument('--warmup', type=non_negative_int, default=None,
                        help=f'untimed iterations first (default 5; {COMPARE_WARMUP} with --compare)')
    parser.add_argument('--repeat', type=positive_int, default=None,
                        help=f'timed iterations (default 20; {COMPARE_REPEAT} with --compare)')
    parser.add_argument('--threads', type=positive_int, default=None,
                        help='CPU threads (torch.set_num_threads)')
    parser.add_argument('--out-json', help='write the measurements to this JSON file')
    parser.add_argument('--compare', nargs='+', default=None, metavar='PEER',
                        help="compare CONFIG's dense backbone (its stage mix and all-linear) with these "
                             f"mmpretrain backbones: {', '.join(PEERS)}")
    parser.add_argument('--resolutions', type=positive_int, nargs='+', default=None,
                        help='square input sizes of the comparison (default '
                             f'{" ".join(map(str, DEFAULT_RESOLUTIONS))}; alone: the two PolaFormer++ variants only)')
    parser.add_argument('--out-dir', default='work_dirs/benchmark_compare',
                        help='where the comparison writes benchmark_compare.csv/.png ("" to write nothing)')
    parser.add_argument('--modes', nargs='+', choices=('inference', 'train'), default=['inference'],
                        help='comparison steps: inference (no_grad, eval) and/or train (forward + backward)')
    parser.add_argument('--profile', action='store_true',
                        help="comparison: print the PyTorch profiler's operator table of one step per cell")
    parser.add_argument('--profile-rows', type=positive_int, default=15, help='operators per --profile table')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config entries')
    add_progress_argument(parser)
    args = parser.parse_args(argv)
    with parser_errors(parser):
        args.shape = image_shape(args.shape)
        for name in args.compare or ():
            if name not in PEERS:
                raise ArgumentCheckError(f'--compare: unknown backbone {name!r}; choose from {", ".join(PEERS)}')
        compare = args.compare is not None or args.resolutions is not None
        if compare and args.shape is not None:
            raise ArgumentCheckError('--shape: the comparison runs square inputs of --resolutions instead')
        if compare and args.checkpoint is not None:
            raise ArgumentCheckError('--checkpoint: the comparison times random weights (speed does not depend on '
                                     'them)')
    args.compare_mode = compare
    if args.warmup is None:
        args.warmup = COMPARE_WARMUP if compare else 5
    if args.repeat is None:
        args.repeat = COMPARE_REPEAT if compare else 20
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


# --------------------------------------------------------------------------- comparison of dense backbones
def dense_backbones(cfg, peers):
    """``[(name, build)]``: CONFIG's backbone (its stage mix, all-linear) and the named peers, 4 stage outputs each.

    ``build()`` returns the backbone (random weights, eval mode); building is deferred so
    that only one model is in memory at a time.
    """
    from mmengine.registry import MODELS, init_default_scope
    from mmengine.utils import import_modules_from_strings

    if cfg.get('default_scope'):
        init_default_scope(cfg.default_scope)
    if 'custom_imports' in cfg:
        import_modules_from_strings(**cfg.custom_imports)
    backbone = cfg.model.get('backbone')
    if not isinstance(backbone, dict) or 'PolaFormerPP' not in str(backbone.get('type')):
        raise ArgumentCheckError(f'config: --compare needs a config whose model.backbone is PolaFormerPP, '
                                 f'got {backbone.get("type") if isinstance(backbone, dict) else backbone!r}')
    from polaformerpp.models.backbones.polaformerpp import RELEASED_ATTN_TYPES
    base = copy.deepcopy(backbone)
    base.update(out_indices=(0, 1, 2, 3), init_cfg=None, frozen_stages=-1)
    arch = base.get('arch', 'b0')
    arch_name = arch if isinstance(arch, str) else 'custom'
    mix = tuple(base.get('attn_types', RELEASED_ATTN_TYPES))
    variants = [(mix, '-'.join('L' if t == 'linear' else 'S' for t in mix))]
    if mix != ('linear', ) * 4:
        variants.append((('linear', ) * 4, 'all-linear'))

    def polaformer(attn_types):
        return lambda: MODELS.build(dict(base, attn_types=attn_types))

    models = [(f'polapp-{arch_name} {label}', polaformer(attn_types)) for attn_types, label in variants]
    for name in peers:
        models.append((name, _peer_builder(name)))
    return models


def _peer_builder(name):
    import mmpretrain.models as mmpretrain_models
    kind, arch = PEERS[name]
    if kind == 'SwinTransformer':
        # pad_small_map: maps smaller than a window (below 224 px) are padded, as at any other size
        return lambda: mmpretrain_models.SwinTransformer(arch=arch, out_indices=(0, 1, 2, 3), pad_small_map=True)
    return lambda: mmpretrain_models.ConvNeXt(arch=arch, out_indices=(0, 1, 2, 3), gap_before_final_norm=False)


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or 'out of memory' in str(exc).lower() or (
        isinstance(exc, RuntimeError) and 'not enough memory' in str(exc).lower())


def forward_peak_memory(forward, device) -> float:
    """Peak memory (MiB) one call of ``forward`` allocates above what was allocated before it.

    CUDA: ``max_memory_allocated``; CPU: the running sum of the PyTorch profiler's
    allocation events (tensors; not the libraries' private scratch buffers).
    """
    if str(device).startswith('cuda'):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        forward()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        forward()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == '[memory]')
    peak = current = 0
    for _, nbytes in events:
        current += nbytes
        peak = max(peak, current)
    return peak / 2**20


def time_forward(forward, device, warmup, repeat):
    """Median / min seconds of ``repeat`` calls after ``warmup`` untimed ones (synchronised on CUDA)."""
    for _ in range(warmup):
        forward()
    times = timed_calls(forward, device, repeat)
    return statistics.median(times), min(times)


#: a training step (forward + backward) counted as three forwards' multiply-accumulates
TRAIN_MAC_FACTOR = 3


def efficiency(macs, seconds, sgemm_gflops):
    """``2 x MACs / latency / sgemm rate``: 1.0 is the machine's matrix-multiply limit."""
    return 2 * macs / seconds / (sgemm_gflops * 1e9)


def count_macs(model, inputs):
    """Multiply-accumulates of one forward of ``model(inputs)`` (mmengine's counter, softmax attention included)."""
    from polaformerpp.analysis import count_complexity
    model.eval()  # (some backbones' train() returns None)
    with torch.no_grad():
        return count_complexity(model, (inputs, ))['flops']


def make_step(model, inputs, mode, autocast):
    """One inference (``no_grad``, eval) or training (train mode, forward + backward of all outputs) step."""
    if mode == 'inference':
        def step():
            with torch.no_grad(), autocast():
                model(inputs)
        return step

    def step():
        for p in model.parameters():
            p.grad = None
        with autocast():
            outs = model(inputs)
        sum(o.float().mean() for o in outs).backward()
    return step


def profile_table(step, rows):
    """The PyTorch profiler's operators by self CPU time over one call of ``step`` (text table)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return prof.key_averages().table(sort_by='self_cpu_time_total', row_limit=rows)


def _set_mode(model, mode):
    model.train(mode == 'train')


def compare_backbones(config, peers=(), resolutions=DEFAULT_RESOLUTIONS, batch_size=1, device='cpu', amp=None,
                      warmup=COMPARE_WARMUP, repeat=COMPARE_REPEAT, cfg_options=None, progress=False,
                      modes=('inference', ), profile_rows=0):
    """Latency, MACs, efficiency and peak memory of CONFIG's dense backbone (two stage mixes) and ``peers``.

    Per resolution and mode every model is timed in interleaved rounds (each
    round runs every model once, then one fp32 ``2048 x 2048`` matrix product
    that measures the machine's rate); latencies and the rate are medians
    over the rounds, so load that drifts hits every network alike.

    Returns:
        list[dict]: one row per (model, resolution, mode): ``model``, ``resolution``, ``mode``,
        ``params``, ``macs_g`` (of the step: a forward's, three forwards' for training),
        ``latency_ms`` (median), ``min_ms``, ``sgemm_gflops``, ``efficiency``,
        ``peak_memory_mib``, ``status`` ('ok', 'OOM' or the error), ``device``,
        ``batch_size``, ``threads``, ``amp`` and, with ``profile_rows``, ``profile``
        (the operator table of one step).
    """
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    cuda = str(device).startswith('cuda')

    def autocast():
        return (torch.autocast(device_type='cuda' if cuda else 'cpu', dtype=AMP_DTYPES[amp])
                if amp else contextlib.nullcontext())

    models = []
    for name, build in dense_backbones(cfg, peers):
        torch.manual_seed(0)
        models.append((name, build().to(device)))
    sgemm = sgemm_seconds(device)
    rows = []
    cells = len(resolutions) * len(modes)
    with ProgressBar(cells * (len(models) + 1), 'resolutions x modes x backbones', enabled=progress) as bar:
        for size in resolutions:
            inputs = torch.randn(batch_size, 3, size, size, device=device)
            forward_macs = {}  # per model at this size: the same forward for every mode
            for mode in modes:
                cell = {}
                for name, model in models:
                    cell[name] = row = dict(
                        model=name, resolution=size, mode=mode, params=sum(p.numel() for p in model.parameters()),
                        macs_g=None, latency_ms=None, min_ms=None, sgemm_gflops=None, efficiency=None,
                        peak_memory_mib=None, status='ok', device=str(device), batch_size=batch_size,
                        threads=None if cuda else torch.get_num_threads(), amp=amp or 'fp32')
                    try:
                        if name not in forward_macs:
                            forward_macs[name] = count_macs(model, inputs)
                        row['macs_g'] = forward_macs[name] * (TRAIN_MAC_FACTOR if mode == 'train' else 1) / 1e9
                        _set_mode(model, mode)
                        step = make_step(model, inputs, mode, autocast)
                        for _ in range(warmup):
                            step()
                        row['peak_memory_mib'] = forward_peak_memory(step, device)
                        row['step'] = step
                    except Exception as exc:  # one cell that does not fit must not end the comparison
                        row['status'] = 'OOM' if is_oom(exc) else f'error: {type(exc).__name__}: {str(exc)[:80]}'
                    finally:
                        if cuda:
                            torch.cuda.empty_cache()
                    bar.update()
                timed = {name: [] for name, row in cell.items() if 'step' in row}
                rates = []
                for _ in range(repeat):
                    for name in timed:
                        try:
                            timed[name].append(timed_calls(cell[name]['step'], device, 1)[0])
                        except Exception as exc:
                            cell[name]['status'] = 'OOM' if is_oom(exc) else f'error: {type(exc).__name__}'
                    rates.append(sgemm_gflops(sgemm()))
                rate = statistics.median(rates)
                for name, row in cell.items():
                    step = row.pop('step', None)
                    if row['status'] == 'ok' and timed.get(name):
                        row['latency_ms'] = statistics.median(timed[name]) * 1e3
                        row['min_ms'] = min(timed[name]) * 1e3
                        row['sgemm_gflops'] = rate
                        row['efficiency'] = efficiency(row['macs_g'] * 1e9, row['latency_ms'] / 1e3, rate)
                        if profile_rows:
                            row['profile'] = profile_table(step, profile_rows)
                    rows.append(row)
                bar.update()
            inputs = None
    return rows


def format_comparison(rows) -> str:
    """Per mode: latency, efficiency and memory tables (models x resolutions) and the speed-ups of ours."""
    lines = []
    for mode in dict.fromkeys(r['mode'] for r in rows):
        if lines:
            lines.append('')
        lines += _format_mode([r for r in rows if r['mode'] == mode], mode)
    return '\n'.join(lines)


def _format_mode(rows, mode):
    models = list(dict.fromkeys(r['model'] for r in rows))
    sizes = list(dict.fromkeys(r['resolution'] for r in rows))
    cell = {(r['model'], r['resolution']): r for r in rows}
    width = max(len(m) for m in models) + 2

    def table(title, key, fmt):
        lines = [f'{title:<{width}}' + ''.join(f'{s:>12}' for s in sizes)]
        for m in models:
            values = []
            for s in sizes:
                r = cell[(m, s)]
                values.append(format(r[key], fmt) if r['status'] == 'ok' and r[key] is not None
                              else r['status'][:11])
            lines.append(f'{m:<{width}}' + ''.join(f'{v:>12}' for v in values))
        return lines

    rates = [r['sgemm_gflops'] for r in rows if r['sgemm_gflops']]
    lines = [f'== {mode} (efficiency = 2 x MACs / latency / sgemm rate; sgemm '
             f'{statistics.median(rates) if rates else float("nan"):.0f} GFLOP/s in this process)']
    lines += table('latency (ms)', 'latency_ms', '.1f') + [''] + table('MACs (G)', 'macs_g', '.2f')
    lines += [''] + table('efficiency', 'efficiency', '.2f')
    lines += [''] + table('peak memory (MiB)', 'peak_memory_mib', '.0f')
    ours = [m for m in models if m.startswith('polapp-')]
    peers = [m for m in models if not m.startswith('polapp-')]
    if peers:
        lines += ['', f'{"speed-up (peer / ours)":<{width + 14}}' + ''.join(f'{s:>8}' for s in sizes)]
        for m in ours:
            for p in peers + ['fastest peer']:
                ratios = []
                for s in sizes:
                    a = cell[(m, s)]
                    times = [cell[(q, s)]['latency_ms'] for q in ([p] if p in peers else peers)
                             if cell[(q, s)]['status'] == 'ok']
                    ok = a['status'] == 'ok' and times
                    ratios.append(f"{min(times) / a['latency_ms']:.2f}x" if ok else '-')
                lines.append(f'{m + " vs " + p:<{width + 14}}' + ''.join(f'{r:>8}' for r in ratios))
    profiled = [r for r in rows if r.get('profile')]
    for r in profiled:
        lines += ['', f"-- operators of {r['model']}, {r['resolution']}^2, {mode} (one step)", r['profile']]
    return lines


CSV_KEYS = ['model', 'resolution', 'mode', 'params', 'macs_g', 'latency_ms', 'min_ms', 'sgemm_gflops',
            'efficiency', 'peak_memory_mib', 'status', 'device', 'threads', 'batch_size', 'amp']


def write_comparison_csv(path, rows):
    with open(path, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=CSV_KEYS, extrasaction='ignore')
        writer.writeheader()
        writer.writerows(rows)


def write_comparison_plot(path, rows) -> bool:
    """Latency and peak memory against resolution (log-log), one line per backbone and mode; False without
    matplotlib."""
    from polaformerpp.analysis import agg_pyplot
    try:
        plt = agg_pyplot()
    except ImportError:
        print('matplotlib is not installed: no plot written')
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    modes = list(dict.fromkeys(r['mode'] for r in rows))
    for mode in modes:
        for name in dict.fromkeys(r['model'] for r in rows):
            points = [(r['resolution'], r['latency_ms'], max(r['peak_memory_mib'], 1e-3)) for r in rows
                      if r['model'] == name and r['mode'] == mode and r['status'] == 'ok']
            if not points:
                continue
            sizes, latency, memory = zip(*points)
            style = '-' if name.startswith('polapp-') else '--'
            label = name if len(modes) == 1 else f'{name} ({mode})'
            axes[0].plot(sizes, latency, style, marker='o' if mode == 'inference' else 's', label=label)
            axes[1].plot(sizes, memory, style, marker='o' if mode == 'inference' else 's', label=label)
    first = rows[0]
    where = first['device'] + (f" ({first['threads']} threads)" if first['threads'] else '')
    for ax, ylabel in zip(axes, ('latency (ms)', 'peak memory of the step (MiB)')):
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.set_xlabel('input resolution (square, pixels)')
        ax.set_ylabel(ylabel)
        ax.set_xticks(sorted({r['resolution'] for r in rows}))
        ax.get_xaxis().set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
        ax.grid(True, which='both', alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"dense backbones, batch {first['batch_size']}, {first['amp']}, {where}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def compare_main(args):
    rows = compare_backbones(args.config, args.compare or (), args.resolutions or DEFAULT_RESOLUTIONS,
                             args.batch_size, args.device, args.amp, args.warmup, args.repeat, args.cfg_options,
                             progress=progress_from_args(args), modes=tuple(args.modes),
                             profile_rows=args.profile_rows if args.profile else 0)
    where = torch.cuda.get_device_name(args.device) if str(args.device).startswith('cuda') else \
        f'cpu ({torch.get_num_threads()} threads)'
    print(f'{osp.basename(args.config)}: dense backbones, batch {args.batch_size}, {where}, {args.amp or "fp32"}, '
          f'median of {args.repeat} interleaved rounds after {args.warmup} warm-up')
    print(format_comparison(rows))
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        csv_path = osp.join(args.out_dir, 'benchmark_compare.csv')
        write_comparison_csv(csv_path, rows)
        print(f'\nwrote {csv_path}')
        png_path = osp.join(args.out_dir, 'benchmark_compare.png')
        if write_comparison_plot(png_path, rows):
            print(f'wrote {png_path}')
    if args.out_json:
        with open(args.out_json, 'w') as f:
            json.dump(rows, f, indent=2)
    return rows


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.compare_mode:
        return compare_main(args)
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
