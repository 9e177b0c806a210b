"""Eager against ``torch.compile``: one training step and one inference step of a classifier.

For the config's classifier (random weights, the data pipeline and batch
augmentations left out) it times, on ``--batch-size`` random images of
``--shape``:

* the training step: ``model(x, labels, mode='loss')``, backward, AdamW step
  (``torch.compile(model)``: the forward and its backward are compiled, the
  optimizer step runs eagerly in both);
* the inference step: ``model(x, mode='tensor')`` under ``no_grad`` in eval
  mode (eager runs the fused modules and kernels where they are built; the
  compiled graph holds the attention's and the scaled residuals' kernels as
  custom ops, and the other fused forms step aside for their plain torch
  forms, which inductor fuses).

Reported per step: the first compiled call (compilation included), the
median of ``--repeat`` timed steps after ``--warmup``, and the speed-up
``eager / compiled``. ``--profile`` adds the PyTorch profiler's table of the
ops that take the time (self CPU time, ``--profile-rows`` rows) of a few
steps of each, eager and compiled.

Examples::

    python tools/analysis_tools/benchmark_compile.py configs/classification/polapp-b0_8xb256_in1k.py \\
        --threads 2 --batch-size 8
    python tools/analysis_tools/benchmark_compile.py configs/classification/polapp-b2_8xb256_in1k.py \\
        --threads 2 --batch-size 8 --profile --out-json compile_b2.json
"""
import argparse
import json
import os.path as osp
import statistics

import torch
from mmengine.config import Config, DictAction

from polaformerpp.analysis import load_model, timed_calls
from polaformerpp.engine.compile import CompileUnavailableError, check_compile_support
from polaformerpp.utils.cli import (
    ArgumentCheckError,
    image_shape,
    non_negative_int,
    parser_errors,
    positive_int,
    run_cli,
    torch_device,
)

STEPS = ('train', 'inference')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Time a training and an inference step, eager vs torch.compile')
    parser.add_argument('config', help='a classification config')
    parser.add_argument('--shape', type=int, nargs='+', default=[224], help='input H W (or one size); default 224')
    parser.add_argument('--batch-size', type=positive_int, default=8)
    parser.add_argument('--device', type=torch_device, default='cpu')
    parser.add_argument('--threads', type=positive_int, default=None, help='CPU threads (torch.set_num_threads)')
    parser.add_argument('--warmup', type=non_negative_int, default=2, help='untimed steps after the first')
    parser.add_argument('--repeat', type=positive_int, default=5, help='timed steps')
    parser.add_argument('--backend', default='inductor', help='torch.compile backend (default inductor)')
    parser.add_argument('--mode', default=None, help="torch.compile mode (e.g. 'max-autotune')")
    parser.add_argument('--steps', nargs='+', choices=STEPS, default=list(STEPS), help='which steps to time')
    parser.add_argument('--profile', action='store_true', help='print where the time goes (PyTorch profiler)')
    parser.add_argument('--profile-rows', type=positive_int, default=15)
    parser.add_argument('--out-json', help='write the measurements to this JSON file')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config entries')
    args = parser.parse_args(argv)
    with parser_errors(parser):
        args.shape = image_shape(args.shape)
        if not osp.isfile(args.config):
            raise ArgumentCheckError(f'config: {args.config} not found')
    return args


def build_classifier(config, cfg_options=None):
    """The config's classifier (random weights) without batch augmentations (they belong to the data side)."""
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if cfg.get('default_scope') != 'mmpretrain':
        raise ArgumentCheckError(f'config: benchmark_compile.py times classifiers (mmpretrain), got scope '
                                 f'{cfg.get("default_scope")!r}')
    cfg.model.pop('train_cfg', None)
    return load_model(cfg)


def _timed(step, device, warmup, repeat):
    """``(first call s, median s)``: the first call (compilation for a compiled model), then warm-up and timing."""
    first = timed_calls(step, device, 1)[0]
    for _ in range(warmup):
        step()
    return first, statistics.median(timed_calls(step, device, repeat))


def make_steps(model, images, samples):
    """``{'train': step, 'inference': step}`` for ``model`` (a module or its compiled wrapper)."""
    module = getattr(model, '_orig_mod', model)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)

    def train():
        module.train()
        loss = model(images, samples, mode='loss')['loss']
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def inference():
        module.eval()
        with torch.no_grad():
            model(images, mode='tensor')

    return dict(train=train, inference=inference)


def profile_table(step, rows: int, runs: int = 3) -> str:
    """The profiler's table (self CPU time) over ``runs`` calls of ``step``."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(runs):
            step()
    return prof.key_averages().table(sort_by='self_cpu_time_total', row_limit=rows)


def benchmark_compile(config, shape=(224, 224), batch_size=8, device='cpu', warmup=2, repeat=5,
                      backend='inductor', mode=None, steps=STEPS, profile=False, profile_rows=15, cfg_options=None):
    """Time ``steps`` eager and compiled; returns a dict per step (seconds, speed-up) and, with
    ``profile``, the profiler tables."""
    import copy

    from mmpretrain.structures import DataSample
    torch.manual_seed(0)
    eager = build_classifier(config, cfg_options).to(device)
    compiled_source = copy.deepcopy(eager)
    options = dict(backend=backend, **(dict(mode=mode) if mode else {}))
    compiled = torch.compile(compiled_source, **options)
    num_classes = eager.head.num_classes
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch_size, 3, *shape, generator=generator).to(device)
    labels = torch.randint(0, num_classes, (batch_size, ), generator=generator)
    samples = [DataSample().set_gt_label(int(label)) for label in labels]
    eager_steps, compiled_steps = make_steps(eager, images, samples), make_steps(compiled, images, samples)
    result = dict(config=config, shape=list(shape), batch_size=batch_size, device=str(device), backend=backend,
                  mode=mode, threads=torch.get_num_threads(), torch=torch.__version__, steps={})
    for name in steps:
        eager_first, eager_median = _timed(eager_steps[name], device, warmup, repeat)
        compile_first, compiled_median = _timed(compiled_steps[name], device, warmup, repeat)
        entry = dict(eager_s=eager_median, compiled_s=compiled_median, speedup=eager_median / compiled_median,
                     first_compiled_call_s=compile_first, first_eager_call_s=eager_first)
        if profile:
            entry['profile_eager'] = profile_table(eager_steps[name], profile_rows)
            entry['profile_compiled'] = profile_table(compiled_steps[name], profile_rows)
        result['steps'][name] = entry
    return result


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        check_compile_support(dict(backend=args.backend), 'cuda' if str(args.device).startswith('cuda') else 'cpu',
                              '--backend')
    except CompileUnavailableError as error:
        raise ArgumentCheckError(str(error)) from None
    result = benchmark_compile(args.config, args.shape, args.batch_size, args.device, args.warmup, args.repeat,
                               args.backend, args.mode, args.steps, args.profile, args.profile_rows, args.cfg_options)
    where = f"{result['device']} ({result['threads']} threads)" if result['device'] == 'cpu' else result['device']
    print(f"{osp.basename(args.config)}: batch {args.batch_size} x {args.shape[0]}x{args.shape[1]}, {where}, "
          f"torch {torch.__version__}, torch.compile backend={args.backend}"
          + (f' mode={args.mode}' if args.mode else ''))
    print(f"{'step':<10} {'eager (ms)':>11} {'compiled (ms)':>14} {'speed-up':>9} {'first compiled call (s)':>24}")
    for name, entry in result['steps'].items():
        print(f"{name:<10} {entry['eager_s'] * 1e3:>11.1f} {entry['compiled_s'] * 1e3:>14.1f} "
              f"{entry['speedup']:>8.2f}x {entry['first_compiled_call_s']:>24.1f}")
    for name, entry in result['steps'].items():
        if 'profile_eager' in entry:
            print(f'\n--- {name} step, eager: where the time goes ---\n{entry["profile_eager"]}')
            print(f'--- {name} step, compiled ---\n{entry["profile_compiled"]}')
    if args.out_json:
        with open(args.out_json, 'w') as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == '__main__':
    run_cli(main)
