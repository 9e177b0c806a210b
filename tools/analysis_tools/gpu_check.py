"""One command for a machine with a GPU: the CUDA tests, the attention benchmark and an AMP training step.

    python tools/analysis_tools/gpu_check.py [--out-dir work_dirs/gpu_check]     (``make gpu-check``)

Every step runs in processes of its own, with a time limit; the limits add up
to under 8 minutes on one GPU:

* ``tests`` (a): ``tests/test_ops/test_pola_attention_cuda.py`` (the Triton
  kernels on CUDA tensors against float64 references) and
  ``test_triton_fallback.py``, split over ``--jobs`` pytest processes that
  share the GPU, so the kernel builds run in parallel (then the autotuner's
  test, which finds every configuration built);
* ``benchmark`` (b): ``benchmark_attention.py --device cuda``, pola-triton vs
  torch SDPA (flash) vs the eager backend, N = 4K ... 200K at B=1, h=1 and the
  PolaFormer++-b2 stage shapes of Mask R-CNN at 1280x800 (2 images: 2x1x64000,
  2x2x16000), d=64, bf16, forward and forward + backward;
* ``train`` (c): an AMP (bf16) training step of the b2 Mask R-CNN config at
  1280x800 (two generated images, random weights) with ``attn_backend``
  triton and torch: the losses of the same weights and data, and step times;
* ``dist`` (d, only with more than one GPU): ``tools/dist_train.sh`` on the
  classification demo config (generated data) for a few iterations over NCCL.

It writes ``summary.md`` (the figures: HBM fraction at N >= 64K, speed-up
over SDPA flash at 200K, forward and backward; loss differences and step
times), ``steps.csv``, ``cuda_tests.csv``, ``benchmark_forward.csv``,
``benchmark_backward.csv``, ``train_step.json``, ``gpu_check.png`` and
every step's log under ``logs/``. It exits 1 when a step failed or ran out of
time. Without CUDA it prints what it would run and exits 0.
"""
import argparse
import csv
import json
import math
import os
import os.path as osp
import shutil
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from typing import Dict, List, NamedTuple, Optional

REPO_ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
CUDA_TESTS = ('tests/test_ops/test_pola_attention_cuda.py', 'tests/test_ops/test_triton_fallback.py')
BENCHMARK = 'tools/analysis_tools/benchmark_attention.py'
BENCH_SEQ_LENS = (4096, 16384, 65536, 131072, 200704)  # 200704 = 448^2: b2 stage 1 at 1792^2
BENCH_SHAPES = ('2x1x64000', '2x2x16000')  # b2 stages 1 and 2 in Mask R-CNN at 1280x800, 2 images
BENCH_BACKENDS = ('pola-triton', 'sdpa', 'pola-torch')
DETECTION_CONFIG = 'configs/detection/mask-rcnn_polapp-b2_fpn_8xb2-amp-1x_coco.py'
TRAIN_IMAGE_HW = (800, 1280)
DEMO_CONFIG = 'configs/classification/polapp-b0_1xb32-30e_demo-shapes.py'
LOSS_RTOL = 1e-2
#: seconds per step; they add up to under 8 minutes
TIME_LIMITS = dict(tests=240, benchmark_forward=45, benchmark_backward=60, train=80, dist=45)


class Step(NamedTuple):
    key: str
    title: str
    waves: List[List[List[str]]]  # commands: the waves one after the other, the commands of a wave at once
    timeout: float


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='CUDA tests, attention benchmark and an AMP training step '
                                                 'on this GPU machine (under 8 minutes)')
    parser.add_argument('--out-dir', default='work_dirs/gpu_check', help='where summary.md, CSV, PNG and logs go')
    parser.add_argument('--steps', nargs='+', choices=('tests', 'benchmark', 'train', 'dist'),
                        default=['tests', 'benchmark', 'train', 'dist'], help='the steps to run (default: all)')
    parser.add_argument('--jobs', type=int, default=min(8, os.cpu_count() or 1),
                        help='pytest processes sharing the GPU for the CUDA tests (default: min(8, CPUs))')
    parser.add_argument('--dry-run', action='store_true', help='print the plan and exit')
    parser.add_argument('--train-step-worker', metavar='JSON', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f'--jobs must be a positive integer, got {args.jobs}')
    return args


# ----------------------------------------------------------------------------
# The plan.
# ----------------------------------------------------------------------------


def benchmark_command(out_dir: str, backward: bool) -> List[str]:
    name = 'benchmark_backward' if backward else 'benchmark_forward'
    cmd = [sys.executable, BENCHMARK, '--device', 'cuda', '--dtypes', 'bf16', '--head-dims', '64', '--heads', '1',
           '--batch-sizes', '1', '--seq-lens', *map(str, BENCH_SEQ_LENS), '--shapes', *BENCH_SHAPES,
           '--backends', *BENCH_BACKENDS, '--repeat', '5', '--warmup', '2', '--no-progress',
           '--out-dir', osp.join(out_dir, name)]
    return cmd + (['--backward'] if backward else [])


def plan(args, num_gpus: int, test_waves: Optional[List[List[List[str]]]] = None) -> List[Step]:
    """The steps to run; ``test_waves``: the CUDA test ids split over the pytest processes of each
    wave (None: the plan as printed, one process for the test files)."""
    out = args.out_dir
    steps = []
    if 'tests' in args.steps:
        waves, index = [], 0
        for wave in test_waves or [[list(CUDA_TESTS)]]:
            commands = []
            for ids in wave:
                commands.append([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-rs',
                                 '--durations=10', f'--junitxml={osp.join(out, "logs", f"cuda_tests_{index}.xml")}',
                                 *ids])
                index += 1
            waves.append(commands)
        processes = (f"{index} pytest processes in {len(waves)} wave{'s' if len(waves) > 1 else ''}" if test_waves else
                     f'split over up to {args.jobs} pytest processes by test')
        steps.append(Step('tests', f'(a) CUDA tests ({processes})', waves, TIME_LIMITS['tests']))
    if 'benchmark' in args.steps:
        for backward in (False, True):
            key = 'benchmark_backward' if backward else 'benchmark_forward'
            steps.append(Step(key, f"(b) attention benchmark, {'forward + backward' if backward else 'forward'}",
                              [[benchmark_command(out, backward)]], TIME_LIMITS[key]))
    if 'train' in args.steps:
        steps.append(Step('train', '(c) AMP bf16 training step, b2 Mask R-CNN at 1280x800, triton vs torch',
                          [[[sys.executable, osp.relpath(__file__, REPO_ROOT), '--train-step-worker',
                             osp.join(out, 'train_step.json')]]], TIME_LIMITS['train']))
    if 'dist' in args.steps:
        if num_gpus > 1:
            steps.append(Step('dist', f'(d) tools/dist_train.sh over NCCL, {num_gpus} GPUs, a few iterations',
                              [[dist_command(out, num_gpus)]], TIME_LIMITS['dist']))
        else:
            steps.append(Step('dist', '(d) tools/dist_train.sh over NCCL: skipped, it needs more than one GPU',
                              [], 0))
    return steps


def dist_command(out_dir: str, num_gpus: int) -> List[str]:
    data = osp.join(out_dir, 'demo_data')
    options = ['train_cfg.max_epochs=1', 'train_dataloader.batch_size=8', 'default_hooks.checkpoint.interval=1',
               'default_hooks.logger.interval=1']
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        options += [f'{key}.dataset.data_root={data}', f'{key}.num_workers=0']
    return ['bash', 'tools/dist_train.sh', DEMO_CONFIG, str(num_gpus), '--work-dir', osp.join(out_dir, 'dist_train'),
            '--no-validate', '--cfg-options', *options]


def print_plan(steps: List[Step]) -> None:
    for step in steps:
        print(f'{step.title}  [limit {step.timeout:.0f} s]')
        for i, wave in enumerate(step.waves):
            for cmd in wave:
                print(('    then ' if i and cmd is wave[0] else '    ') + ' '.join(cmd))
    print(f'in all at most {sum(s.timeout for s in steps):.0f} s')


# ----------------------------------------------------------------------------
# Running the steps.
# ----------------------------------------------------------------------------


def child_env() -> Dict[str, str]:
    """The environment of the steps: the kernels compiled for the device (no interpreter)."""
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    env['PYTHONPATH'] = os.pathsep.join(p for p in (REPO_ROOT, env.get('PYTHONPATH')) if p)
    env.setdefault('POLAPP_NO_PROGRESS', '1')
    return env


def collect_test_ids(env) -> List[str]:
    proc = subprocess.run([sys.executable, '-m', 'pytest', '--collect-only', '-q', '-p', 'no:cacheprovider',
                           *CUDA_TESTS], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    return [line.strip() for line in proc.stdout.splitlines() if '::' in line]


def shard(test_ids: List[str], jobs: int) -> List[List[List[str]]]:
    """Two waves of pytest processes: every test but the autotuner's round-robin over ``jobs``
    processes (the builds run in parallel), then the autotuner's (which then finds every
    configuration built)."""
    last = [t for t in test_ids if 'autotuner' in t]
    rest = [t for t in test_ids if t not in last]
    first = [rest[i::jobs] for i in range(jobs) if rest[i::jobs]]
    waves = [wave for wave in (first, [last] if last else []) if wave]
    return waves or [[list(CUDA_TESTS)]]


def run_step(step: Step, env, log_dir: str) -> dict:
    """Run the step's commands concurrently within its time limit; returns status, seconds, log paths."""
    start = time.time()
    if not step.waves:
        return dict(key=step.key, title=step.title, status='skipped', seconds=0.0, logs=[])
    commands = [cmd for wave in step.waves for cmd in wave]
    status, logs = 'ok', []
    for wave in step.waves:
        procs = []
        for cmd in wave:
            log = osp.join(log_dir, f'{step.key}_{len(logs)}.log' if len(commands) > 1 else f'{step.key}.log')
            handle = open(log, 'w')
            handle.write('$ ' + ' '.join(cmd) + '\n')
            handle.flush()
            procs.append((subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                           start_new_session=True), handle))
            logs.append(log)
        for proc, handle in procs:
            remaining = step.timeout - (time.time() - start)
            try:
                code = proc.wait(timeout=max(remaining, 1))
                if code != 0 and status == 'ok':
                    status = f'failed (exit {code})'
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
                status = f'ran out of time ({step.timeout:.0f} s)'
            handle.close()
    seconds = time.time() - start
    print(f'{step.title}: {status} in {seconds:.0f} s', flush=True)
    return dict(key=step.key, title=step.title, status=status, seconds=seconds, logs=logs)


def check_cuda_tests_ran(result: dict, out_dir: str) -> None:
    """A test step whose CUDA tests all skipped (or none ran) failed, whatever pytest's exit code."""
    ran = [t for t in read_junit(_junit_paths(out_dir))
           if t['test'].startswith(CUDA_TESTS[0][:-3].replace('/', '.')) and t['outcome'] != 'skipped']
    if not ran and result['status'] == 'ok':
        result['status'] = 'failed (no CUDA test ran: see logs/tests_*.log)'
        print(f"{result['title']}: {result['status']}", flush=True)


def _junit_paths(out_dir: str) -> List[str]:
    logs = osp.join(out_dir, 'logs')
    return sorted(osp.join(logs, n) for n in os.listdir(logs) if n.startswith('cuda_tests_') and n.endswith('.xml'))


def prepare_dist_data(out_dir: str, env) -> None:
    subprocess.run([sys.executable, 'tools/misc/make_demo_data.py', osp.join(out_dir, 'demo_data'),
                    '--train-per-class', '16', '--val-per-class', '2'], cwd=REPO_ROOT, env=env, check=True,
                   capture_output=True, timeout=120)
    env['PORT'] = str(free_port())
    env['MAX_RESTARTS'] = '0'
    env['PYTHON'] = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------
# (c) the training step (run in a process of its own).
# ----------------------------------------------------------------------------


def check_mmcv_cuda_ops() -> None:
    """Raise unless mmcv's compiled ops (NMS, used by the RPN) run on CUDA tensors here."""
    import torch
    from mmcv.ops import nms
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0]], device='cuda')
    try:
        nms(boxes, torch.tensor([0.9, 0.8], device='cuda'), 0.5)
    except Exception as exc:
        raise RuntimeError(f"mmcv's compiled ops do not run on CUDA tensors here ({type(exc).__name__}: {exc}); "
                           'build mmcv with its CUDA ops on this machine (tools/setup_env.sh with nvcc on PATH) '
                           'for the Mask R-CNN step') from exc


def _autocast_backbone_only(model):
    """Run only the backbone under bf16 autocast (its outputs cast back to fp32)."""
    import torch
    forward = model.backbone.forward

    def bf16_forward(x):
        with torch.autocast('cuda', dtype=torch.bfloat16):
            outs = forward(x)
        return tuple(o.float() for o in outs)
    model.backbone.forward = bf16_forward


def train_step_worker(out_json: str, timed_steps: int = 5, warmup_steps: int = 2) -> dict:
    """Losses of one batch with attn_backend triton and torch (same weights, data and sampling seed)
    and the time of an AMP (bf16) AdamW step of each; written to ``out_json``.

    The whole model runs under bf16 autocast, RoIAlign through torchvision (mmcv
    2.1's kernel has no bf16); where another op of mmcv's refuses bf16 the step is
    measured again with only the backbone (the attention) under autocast
    (``amp_scope`` in the result says which).
    """
    import torch
    from mmdet.registry import MODELS
    from mmdet.testing import demo_mm_inputs
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    import polaformerpp  # noqa: F401  (registers the backbone)
    from polaformerpp.models.layers.attention import PolaLinearAttention

    check_mmcv_cuda_ops()
    init_default_scope('mmdet')
    cfg = Config.fromfile(osp.join(REPO_ROOT, DETECTION_CONFIG))
    cfg.model.backbone.init_cfg = None  # random weights: no ImageNet checkpoint needed
    for extractor in ('bbox_roi_extractor', 'mask_roi_extractor'):
        cfg.model.roi_head[extractor].roi_layer.use_torchvision = True
    torch.manual_seed(0)
    model = MODELS.build(cfg.model).cuda().train()
    attention = [m for m in model.modules() if isinstance(m, PolaLinearAttention)]
    height, width = TRAIN_IMAGE_HW
    batch = demo_mm_inputs(2, [(3, height, width)] * 2, num_items=[6, 9], num_classes=80, with_mask=True)
    try:
        return _measure_train_step(model, attention, batch, 'model', out_json, timed_steps, warmup_steps)
    except RuntimeError as exc:
        if 'bfloat16' not in str(exc).lower():
            raise
        print(f'bf16 autocast of the whole model failed ({exc}); autocasting the backbone only', flush=True)
    _autocast_backbone_only(model)
    return _measure_train_step(model, attention, batch, 'backbone', out_json, timed_steps, warmup_steps)


def _measure_train_step(model, attention, batch, amp_scope, out_json, timed_steps, warmup_steps) -> dict:
    import torch

    def loss_of_batch(backend):
        for module in attention:
            module.backend = backend
        data = model.data_preprocessor(batch, True)
        torch.manual_seed(0)  # the same proposal sampling
        with torch.autocast('cuda', dtype=torch.bfloat16, enabled=amp_scope == 'model'):
            losses = model(**data, mode='loss')
        loss, log_vars = model.parse_losses(losses)
        return loss, log_vars

    result = dict(config=DETECTION_CONFIG, image_hw=TRAIN_IMAGE_HW, batch=2, amp_scope=amp_scope,
                  attention_layers=len(attention), device=torch.cuda.get_device_name(), backends={})
    for backend in ('triton', 'torch'):
        model.zero_grad(set_to_none=True)
        loss, log_vars = loss_of_batch(backend)
        loss.backward()
        grads = torch.cat([p.grad.flatten().float() for p in model.backbone.parameters() if p.grad is not None])
        result['backends'][backend] = dict(losses={k: float(v) for k, v in log_vars.items()},
                                           backbone_grad_norm=float(grads.norm()))
    terms = result['backends']['torch']['losses']
    result['loss_rel_diff'] = {k: abs(result['backends']['triton']['losses'][k] - v) / max(abs(v), 1e-12)
                               for k, v in terms.items()}
    norms = [result['backends'][b]['backbone_grad_norm'] for b in ('triton', 'torch')]
    result['backbone_grad_norm_rel_diff'] = abs(norms[0] - norms[1]) / max(norms[1], 1e-12)
    result['losses_equal'] = result['loss_rel_diff']['loss'] <= LOSS_RTOL

    state = {k: v.clone() for k, v in model.state_dict().items()}
    for backend in ('triton', 'torch'):
        model.load_state_dict(state)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
        times = []
        torch.cuda.reset_peak_memory_stats()
        for i in range(warmup_steps + timed_steps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss, _ = loss_of_batch(backend)
            loss.backward()
            optimizer.step()
            torch.cuda.synchronize()
            if i >= warmup_steps:
                times.append(time.perf_counter() - start)
        times.sort()
        result['backends'][backend].update(step_ms=1e3 * times[len(times) // 2], step_ms_all=[1e3 * t for t in times],
                                           peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30)
    with open(out_json, 'w') as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    return result


# ----------------------------------------------------------------------------
# The summary.
# ----------------------------------------------------------------------------


def read_junit(paths: List[str]) -> List[dict]:
    rows = []
    for path in paths:
        if not osp.isfile(path):
            continue
        for case in ElementTree.parse(path).getroot().iter('testcase'):
            outcome, message = 'passed', ''
            for tag in ('failure', 'error', 'skipped'):
                node = case.find(tag)
                if node is not None:
                    outcome, message = {'failure': 'failed', 'error': 'error', 'skipped': 'skipped'}[tag], \
                        (node.get('message') or '')[:200]
            rows.append(dict(test=f"{case.get('classname')}::{case.get('name')}", outcome=outcome,
                             seconds=float(case.get('time') or 0), message=message))
    return rows


def read_csv(path: str) -> List[dict]:
    if not osp.isfile(path):
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def _num(value) -> Optional[float]:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def benchmark_figures(rows: List[dict]) -> dict:
    """HBM fraction of pola-triton at N >= 64K (B=1, h=1) and its speed-up over SDPA at the longest N."""
    single = [r for r in rows if r['batch'] == '1' and r['heads'] == '1' and r['status'] == 'ok']
    by_cell = {(r['backend'], int(r['seq_len'])): r for r in single}
    long_fractions = [_num(r['peak_fraction']) for r in single
                      if r['backend'] == 'pola-triton' and int(r['seq_len']) >= 65536 and _num(r['peak_fraction'])]
    lengths = sorted({n for b, n in by_cell if b == 'pola-triton'})
    figures = dict(hbm_fraction_min=min(long_fractions) if long_fractions else None,
                   hbm_fraction_max=max(long_fractions) if long_fractions else None)
    if lengths:
        longest = lengths[-1]
        triton, sdpa = by_cell.get(('pola-triton', longest)), by_cell.get(('sdpa', longest))
        figures['longest_n'] = longest
        if triton and sdpa:
            figures['speedup_over_sdpa'] = float(sdpa['time_ms']) / float(triton['time_ms'])
            figures['sdpa_kernel'] = sdpa.get('note', '')
    return figures


def benchmark_table(rows: List[dict]) -> List[str]:
    lines = ['| B | h | N | backend | time ms | tokens/s | peak MiB | GB/s | of HBM peak | note |',
             '|---|---|---|---|---|---|---|---|---|---|']
    for r in rows:
        frac = _num(r.get('peak_fraction'))
        gbps = _num(r.get('gbps'))
        ok = r['status'] == 'ok'
        lines.append(f"| {r['batch']} | {r['heads']} | {r['seq_len']} | {r['backend']} | "
                     f"{float(r['time_ms']):.3f} | {float(r['tokens_per_s']):.3e} | {float(r['peak_mib']):.1f} | "
                     f"{gbps:.0f} | {100 * frac:.0f}% | {r.get('note', '')} |" if ok else
                     f"| {r['batch']} | {r['heads']} | {r['seq_len']} | {r['backend']} | {r['status']} | | | | | |")
    return lines


def write_plot(path: str, forward: List[dict], backward: List[dict]) -> bool:
    from polaformerpp.analysis import agg_pyplot
    try:
        plt = agg_pyplot()
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, rows, title in ((axes[0], forward, 'forward'), (axes[1], backward, 'forward + backward')):
        for backend in BENCH_BACKENDS:
            points = sorted((int(r['seq_len']), float(r['time_ms'])) for r in rows
                            if r['backend'] == backend and r['status'] == 'ok' and r['batch'] == '1'
                            and r['heads'] == '1')
            if points:
                ax.plot(*zip(*points), marker='o', label=backend)
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.set_xlabel('tokens N (B=1, h=1, d=64, bf16)')
        ax.set_ylabel('median time (ms)')
        ax.set_title(title)
        ax.grid(True, which='both', alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_summary(out_dir: str, results: List[dict], device: str, elapsed: float) -> str:
    lines = ['# GPU check', '', f'device: {device}; {elapsed:.0f} s in all', '', '| step | status | seconds |',
             '|---|---|---|']
    lines += [f"| {r['title']} | {r['status']} | {r['seconds']:.0f} |" for r in results]
    with open(osp.join(out_dir, 'steps.csv'), 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=['key', 'title', 'status', 'seconds'], extrasaction='ignore')
        writer.writeheader()
        writer.writerows(results)

    tests = read_junit(_junit_paths(out_dir))
    if tests:
        with open(osp.join(out_dir, 'cuda_tests.csv'), 'w', newline='') as f:
            writer = csv.DictWriter(f, fieldnames=['test', 'outcome', 'seconds', 'message'])
            writer.writeheader()
            writer.writerows(tests)
        counts = {o: sum(t['outcome'] == o for t in tests) for o in ('passed', 'failed', 'error', 'skipped')}
        lines += ['', '## (a) CUDA tests', '', ', '.join(f'{v} {k}' for k, v in counts.items()), '']
        lines += [f"* {t['outcome']}: `{t['test']}` {t['message']}" for t in tests if t['outcome'] != 'passed']
        slowest = sorted(tests, key=lambda t: -t['seconds'])[:5]
        lines += ['', 'slowest: ' + ', '.join(f"`{t['test'].split('::')[-1]}` {t['seconds']:.0f} s" for t in slowest)]

    forward, backward = (read_csv(osp.join(out_dir, n, 'benchmark_attention.csv'))
                         for n in ('benchmark_forward', 'benchmark_backward'))
    for name, rows in (('forward', forward), ('backward', backward)):
        if rows:
            shutil.copy(osp.join(out_dir, f'benchmark_{name}', 'benchmark_attention.csv'),
                        osp.join(out_dir, f'benchmark_{name}.csv'))
    if forward or backward:
        lines += ['', '## (b) attention benchmark (d=64, bf16, RoPE grid for the pola backends)', '']
        for title, rows in (('forward', forward), ('forward + backward', backward)):
            if not rows:
                continue
            fig = benchmark_figures(rows)
            frac = (f"{100 * fig['hbm_fraction_min']:.0f}-{100 * fig['hbm_fraction_max']:.0f}%"
                    if fig.get('hbm_fraction_min') is not None else 'n/a')
            speedup = (f"{fig['speedup_over_sdpa']:.1f}x over SDPA ({fig.get('sdpa_kernel')}) at N={fig['longest_n']}"
                       if fig.get('speedup_over_sdpa') else 'n/a')
            lines += [f'**{title}**: pola-triton reaches {frac} of the HBM peak at N >= 64K; {speedup}.', '']
            lines += benchmark_table(rows) + ['']
        if write_plot(osp.join(out_dir, 'gpu_check.png'), forward, backward):
            lines += ['![time against N](gpu_check.png)', '']

    train_json = osp.join(out_dir, 'train_step.json')
    if osp.isfile(train_json):
        with open(train_json) as f:
            train = json.load(f)
        lines += ['', f"## (c) AMP bf16 training step: {train['config']}, {train['batch']} images "
                      f"{train['image_hw'][1]}x{train['image_hw'][0]}, {train['attention_layers']} pola layers", '',
                  f"bf16 autocast over the {train.get('amp_scope', 'model')}", '',
                  '| | triton | torch | rel. difference |', '|---|---|---|---|']
        tri, ref = train['backends']['triton'], train['backends']['torch']
        for k, v in ref['losses'].items():
            lines.append(f"| {k} | {tri['losses'][k]:.5f} | {v:.5f} | {train['loss_rel_diff'][k]:.1e} |")
        lines.append(f"| backbone grad norm | {tri['backbone_grad_norm']:.5g} | {ref['backbone_grad_norm']:.5g} | "
                     f"{train['backbone_grad_norm_rel_diff']:.1e} |")
        lines.append(f"| step time (ms, median) | {tri['step_ms']:.1f} | {ref['step_ms']:.1f} | "
                     f"speed-up {ref['step_ms'] / tri['step_ms']:.2f}x |")
        lines.append(f"| peak memory (GiB) | {tri['peak_mem_gib']:.2f} | {ref['peak_mem_gib']:.2f} | |")
        lines += ['', f"losses equal to {LOSS_RTOL:g}: {'yes' if train['losses_equal'] else 'NO'}"]
    path = osp.join(out_dir, 'summary.md')
    with open(path, 'w') as f:
        f.write('\n'.join(lines) + '\n')
    return path


# ----------------------------------------------------------------------------


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.train_step_worker:
        result = train_step_worker(args.train_step_worker)
        return 0 if result['losses_equal'] else 1
    import torch
    num_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not num_gpus or args.dry_run:
        print('gpu-check plan:')
        print_plan(plan(args, max(num_gpus, 1)))
        if not num_gpus:
            print('no CUDA device here (torch.cuda.is_available() is False): nothing was run. '
                  'Run `make gpu-check` on a machine with a GPU.')
        return 0

    out_dir = args.out_dir = osp.abspath(args.out_dir)
    os.makedirs(osp.join(out_dir, 'logs'), exist_ok=True)
    env = child_env()
    start = time.time()
    waves = None
    if 'tests' in args.steps:
        test_ids = collect_test_ids(env)
        if not any(t.startswith(CUDA_TESTS[0]) for t in test_ids):
            test_ids.append(CUDA_TESTS[0])  # collected nothing: run it whole, its log says why
        waves = shard(test_ids, args.jobs)
    steps = plan(args, num_gpus, waves)
    print_plan(steps)
    results = []
    for step in steps:
        if step.key == 'dist' and step.waves:
            prepare_dist_data(out_dir, env)
        results.append(run_step(step, env, osp.join(out_dir, 'logs')))
        if step.key == 'tests':
            check_cuda_tests_ran(results[-1], out_dir)
    device = f'{torch.cuda.get_device_name(0)} x {num_gpus}'
    summary = write_summary(out_dir, results, device, time.time() - start)
    print(open(summary).read())
    print(f'wrote {summary}')
    return 0 if all(r['status'] in ('ok', 'skipped') for r in results) else 1


if __name__ == '__main__':
    sys.exit(main())
