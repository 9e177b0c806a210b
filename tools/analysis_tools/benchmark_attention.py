"""Long-sequence benchmark of the PolaFormer++ attention op.

Sweeps the sequence length N (and batch, heads, head dim, dtype) and times:

* ``pola-torch``  - :func:`pola_attention` with ``backend='torch'`` (eager);
* ``pola-cpu``    - the compiled CPU kernels (``backend='cpu'``, CPU only);
* ``pola-triton`` - the fused Triton kernels (CUDA only);
* ``sdpa``        - ``torch.nn.functional.scaled_dot_product_attention`` (the
  kernel it ran is reported: flash / efficient / cudnn / math);
* ``naive``       - the same polarity-aware linear attention written the way a
  paper's code writes it (separate relu/cat/exp tensors, two matmul chains):
  :func:`polaformerpp.ops.pola_attention.naive_pola_attention`.

For each cell it prints the median time, tokens/s, the peak memory the call
added on top of its inputs, for the pola backends' fp32 forward the time over
its GEMM floor (``x floor``: the time its two matrix products, the key state
and the readout, take at the machine's fp32 matrix-multiply rate, measured by
a 2048 x 2048 product interleaved with the timed runs) and, on CUDA, the
achieved bandwidth for the ideal traffic (read q, k, v once, write o once)
against the device's peak. A cell that runs out of memory prints ``OOM``.
Results go to a CSV file and a log-log plot of time and memory against N. While the cells run, a progress bar over
them goes to stderr when it is a terminal (``--no-progress`` or
``POLAPP_NO_PROGRESS=1``: none); the table goes to stdout.

Besides the sweep over ``--batch-sizes x --heads x --seq-lens``, ``--shapes``
adds single ``(B, h, N)`` cells, e.g. the stages of a model at its input size.

Examples::

    python tools/analysis_tools/benchmark_attention.py --device cpu --seq-lens 256 1024 --repeat 3
    python tools/analysis_tools/benchmark_attention.py --dtypes bf16 --seq-lens 4096 16384 65536 200704
    # + PolaFormer++-b2 stages 1 and 2 in Mask R-CNN at 1280x800, two images
    python tools/analysis_tools/benchmark_attention.py --backends pola-triton sdpa pola-torch \
        --seq-lens 4096 65536 200704 --shapes 2x1x64000 2x2x16000 --backward
"""
import argparse
import csv
import itertools
import math
import multiprocessing as mp
import os
import os.path as osp
import resource
import statistics
import time

import torch
import torch.nn.functional as F

from polaformerpp.analysis import sgemm_gflops, sgemm_seconds
from polaformerpp.ops import RopeGrid, available_backends, pola_attention, pola_rope_tables
from polaformerpp.ops.pola_attention import naive_pola_attention
from polaformerpp.utils.cli import (
    non_negative_int,
    positive_float,
    positive_int,
    positive_multiple_of,
    run_cli,
    torch_device,
)
from polaformerpp.utils.progress import ProgressBar, add_progress_argument, progress_from_args

BACKENDS = ('pola-torch', 'pola-cpu', 'pola-triton', 'sdpa', 'naive')
DTYPES = {'fp32': torch.float32, 'fp16': torch.float16, 'bf16': torch.bfloat16}
DEFAULT_SEQ_LENS = (1024, 4096, 16384, 65536, 131072, 200704)
CPU_DEFAULT_SEQ_LENS = (256, 1024, 4096)


def shape_triple(text):
    """argparse type: ``BxHxN`` (batch, heads, tokens), each a positive integer, e.g. ``2x1x64000``."""
    parts = text.lower().split('x')
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f'must be BxHxN (batch x heads x tokens), e.g. 2x1x64000, got {text!r}')
    return tuple(positive_int(p) for p in parts)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Benchmark pola_attention against SDPA and naive code')
    parser.add_argument('--device', type=torch_device, default='cuda' if torch.cuda.is_available() else 'cpu',
                        help='cpu or cuda[:i] (default: cuda when available)')
    parser.add_argument('--seq-lens', type=positive_int, nargs='+', default=None,
                        help=f'token counts N (default {DEFAULT_SEQ_LENS} on CUDA, '
                             f'{CPU_DEFAULT_SEQ_LENS} on CPU)')
    parser.add_argument('--batch-sizes', type=positive_int, nargs='+', default=[1])
    parser.add_argument('--heads', type=positive_int, nargs='+', default=[1])
    parser.add_argument('--shapes', type=shape_triple, nargs='+', default=[], metavar='BxHxN',
                        help='extra (batch, heads, tokens) cells besides the sweep, e.g. 2x1x64000')
    parser.add_argument('--head-dims', type=positive_multiple_of(4, '2-D RoPE'), nargs='+', default=[64])
    parser.add_argument('--dtypes', nargs='+', choices=sorted(DTYPES), default=None,
                        help='default: fp32 on CPU, bf16 on CUDA')
    parser.add_argument('--backends', nargs='+', choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument('--no-rope', action='store_true', help='pola backends without the 2-D RoPE')
    parser.add_argument('--rope-form', choices=('grid', 'tables'), default='grid',
                        help='how the pola backends get the RoPE: RopeGrid(H, W) (row/column tables, what '
                             'the backbone passes) or two (N, 2d) tables (the naive code always uses tables)')
    parser.add_argument('--backward', action='store_true', help='time forward + backward')
    parser.add_argument('--repeat', type=positive_int, default=10, help='timed runs per cell (median reported)')
    parser.add_argument('--warmup', type=non_negative_int, default=2)
    parser.add_argument('--peak-gbps', type=positive_float, default=None,
                        help='device memory bandwidth in GB/s (default: from the device properties)')
    parser.add_argument('--out-dir', default='work_dirs/benchmark_attention',
                        help='where benchmark_attention.csv/.png go ("" to write nothing)')
    parser.add_argument('--threads', type=positive_int, default=None,
                        help='CPU: torch threads per cell (default: torch\'s default; pin it on a busy machine)')
    parser.add_argument('--no-isolate', action='store_true',
                        help='CPU: run cells in this process (faster; peak memory becomes approximate)')
    add_progress_argument(parser)
    args = parser.parse_args(argv)
    cuda = args.device.startswith('cuda')
    if args.seq_lens is None:
        args.seq_lens = list(DEFAULT_SEQ_LENS if cuda else CPU_DEFAULT_SEQ_LENS)
    if args.dtypes is None:
        args.dtypes = ['bf16' if cuda else 'fp32']
    return args


# ----------------------------------------------------------------------------
# The implementations being compared.
# ----------------------------------------------------------------------------


def grid_shape(num_tokens):
    """A near-square ``(H, W)`` with ``H * W == N`` for the RoPE tables."""
    height = int(math.isqrt(num_tokens))
    while num_tokens % height:
        height -= 1
    return height, num_tokens // height


def make_inputs(batch, heads, num_tokens, head_dim, dtype, device, rope, requires_grad):
    """``q, k, v`` ``(B, h, N, d)``, sigmoid'ed temperatures ``(h, 2d)`` fp32, RoPE tables or None.

    ``rope``: ``'off'``, ``'grid'`` or ``'tables'`` (tables are made for both forms: the naive code
    reads them).
    """
    gen = torch.Generator(device='cpu').manual_seed(0)

    def rand(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(device=device, dtype=dtype)

    q, k, v = (rand(batch, heads, num_tokens, head_dim, scale=0.5) for _ in range(3))
    temps = [torch.rand(heads, 2 * head_dim, generator=gen).to(device) for _ in range(2)]
    tensors = [q, k, v] + temps
    if requires_grad:
        for t in tensors:
            t.requires_grad_()
    tables = pola_rope_tables(*grid_shape(num_tokens), head_dim, device=device) if rope != 'off' else None
    return tensors, tables


def sdpa_backends():
    """``(name, SDPBackend)`` in the order PyTorch's dispatcher prefers them."""
    from torch.nn.attention import SDPBackend
    names = ['FLASH_ATTENTION', 'EFFICIENT_ATTENTION', 'CUDNN_ATTENTION', 'MATH']
    return [(n.lower().replace('_attention', ''), getattr(SDPBackend, n)) for n in names
            if hasattr(SDPBackend, n)]


def pick_sdpa_backend(device, dtype, head_dim):
    """The SDPA kernel PyTorch runs for these inputs (the first that accepts them)."""
    from torch.nn.attention import sdpa_kernel
    q = torch.randn(1, 1, 16, head_dim, device=device, dtype=dtype)
    for name, backend in sdpa_backends():
        try:
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(q, q, q)
            return name, backend
        except RuntimeError:
            continue
    raise RuntimeError('no SDPA backend accepts these inputs')


def build_call(backend, inputs, rope, sdpa_backend=None, rope_form='tables'):
    """A zero-argument callable running one backend on ``inputs`` (``rope``: tables or None)."""
    q, k, v, temp_same, temp_opp = inputs
    if backend in ('pola-torch', 'pola-cpu', 'pola-triton'):
        impl = backend.split('-')[1]
        if rope is not None and rope_form == 'grid':
            rope = RopeGrid(*grid_shape(q.shape[-2]))
        return lambda: pola_attention(q, k, v, temp_same, temp_opp, rope=rope, backend=impl)
    if backend == 'naive':
        return lambda: naive_pola_attention(q, k, v, temp_same, temp_opp, rope)
    if backend == 'sdpa':
        from torch.nn.attention import sdpa_kernel

        def call():
            with sdpa_kernel([sdpa_backend]):
                return F.scaled_dot_product_attention(q, k, v)
        return call
    raise ValueError(f'unknown backend {backend!r}')


# ----------------------------------------------------------------------------
# Measuring one cell.
# ----------------------------------------------------------------------------


def is_oom(exc):
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc).lower()
    return 'out of memory' in text or "can't allocate memory" in text or 'not enough memory' in text


def synchronize(device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def run_once(call, inputs, backward):
    out = call()
    if backward:
        out.backward(torch.ones_like(out))
        for t in inputs:
            t.grad = None
    return out


def time_call(call, inputs, device, repeat, warmup, backward, between=None):
    """Median wall time in ms; with ``between`` (a callable returning seconds) also the
    median of its times, one call after each timed run (interleaved rounds)."""
    for _ in range(warmup):
        run_once(call, inputs, backward)
    synchronize(device)
    times, between_times = [], []
    for _ in range(repeat):
        synchronize(device)
        start = time.perf_counter()
        run_once(call, inputs, backward)
        synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
        if between is not None:
            between_times.append(between())
    median = statistics.median(times)
    return (median, statistics.median(between_times)) if between is not None else median


def product_flops(cell):
    """FLOPs of the two matrix products of the pola op's forward (``dv = d``).

    The key state ``phi(k)^T v`` (``2d x dv`` per head: ``2 N 2d dv``) and the
    two streams' readouts (each ``(N, 2d) @ (2d, dv/2)``: ``2 N 2d dv`` together).
    Their time at the in-process sgemm rate is the op's GEMM floor.
    """
    head_dim = cell['head_dim']
    return 4 * cell['batch'] * cell['heads'] * cell['seq_len'] * 2 * head_dim * head_dim


def has_gemm_floor(cell):
    """The pola backends' forward in fp32: the cells measured against their GEMM floor."""
    return cell['backend'].startswith('pola') and not cell['backward'] and cell['dtype'] == 'fp32'


def current_rss_bytes():
    """Resident set size of this process (Linux); falls back to the peak."""
    try:
        with open('/proc/self/statm') as f:
            return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
    except (OSError, ValueError, IndexError):
        return peak_rss_bytes()


def reset_peak_rss():
    """Restart the peak RSS count here (Linux: VmHWM), so that a cell's peak is not an
    earlier one (imports, input generation); False where the kernel does not allow it."""
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        return True
    except OSError:
        return False


def peak_rss_bytes():
    """Peak RSS since :func:`reset_peak_rss` (VmHWM), else since the process started."""
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith('VmHWM:'):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def measure_cell(cell):
    """Time one (backend, shape, dtype) cell; returns a result dict (``status`` 'ok'/'OOM'/error)."""
    device = torch.device(cell['device'])
    dtype = DTYPES[cell['dtype']]
    result = dict(cell, time_ms=None, peak_mib=None, sgemm_gflops=None, floor_ms=None, status='ok', note='')
    if cell.get('threads'):
        torch.set_num_threads(cell['threads'])
    try:
        sdpa_backend = None
        if cell['backend'] == 'sdpa':
            result['note'], sdpa_backend = pick_sdpa_backend(device, dtype, cell['head_dim'])
        inputs, rope = make_inputs(cell['batch'], cell['heads'], cell['seq_len'], cell['head_dim'],
                                   dtype, device, cell['rope'], cell['backward'])
        call = build_call(cell['backend'], inputs, rope, sdpa_backend, cell['rope'])
        if device.type == 'cuda':
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        else:
            reset_peak_rss()
            base = current_rss_bytes()
        if has_gemm_floor(cell):  # rounds interleaved with the sgemm that measures the machine's rate
            result['time_ms'], sgemm = time_call(call, inputs, device, cell['repeat'], cell['warmup'], False,
                                                 between=sgemm_seconds(device))
            result['sgemm_gflops'] = sgemm_gflops(sgemm)
            result['floor_ms'] = product_flops(cell) / (result['sgemm_gflops'] * 1e9) * 1e3
        else:
            result['time_ms'] = time_call(call, inputs, device, cell['repeat'], cell['warmup'], cell['backward'])
        peak = torch.cuda.max_memory_allocated(device) if device.type == 'cuda' else peak_rss_bytes()
        result['peak_mib'] = max(peak - base, 0) / 2**20
    except Exception as exc:  # one bad cell must not end the sweep
        if is_oom(exc):
            result['status'] = 'OOM'
        else:
            result['status'] = f'error: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}'
    finally:
        if device.type == 'cuda':
            torch.cuda.empty_cache()
    return result


def _isolated_worker(cell, queue):
    queue.put(measure_cell(cell))


def measure_cell_isolated(cell):
    """CPU: run the cell in a fresh process so that its peak RSS is its own."""
    ctx = mp.get_context('spawn')
    queue = ctx.Queue()
    proc = ctx.Process(target=_isolated_worker, args=(cell, queue))
    proc.start()
    proc.join()
    if not queue.empty():
        return queue.get()
    status = 'OOM' if proc.exitcode in (-9, 137) else f'error: worker exited {proc.exitcode}'
    return dict(cell, time_ms=None, peak_mib=None, sgemm_gflops=None, floor_ms=None, status=status, note='')


# ----------------------------------------------------------------------------
# Reporting.
# ----------------------------------------------------------------------------


def ideal_bytes(cell):
    """Read q, k, v and write o once (and the backward's own reads/writes when timed)."""
    element = torch.tensor([], dtype=DTYPES[cell['dtype']]).element_size()
    tensor = cell['batch'] * cell['heads'] * cell['seq_len'] * cell['head_dim'] * element
    return tensor * (4 + (7 if cell['backward'] else 0))  # backward: read q,k,v,do; write dq,dk,dv


def device_peak_gbps(device, override):
    if override:
        return override
    if device.type != 'cuda':
        return None
    props = torch.cuda.get_device_properties(device)
    clock_khz, bus_bits = getattr(props, 'memory_clock_rate', 0), getattr(props, 'memory_bus_width', 0)
    if not clock_khz or not bus_bits:
        return None
    return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9  # double data rate


def add_derived(result, peak_gbps):
    tokens = result['batch'] * result['seq_len']
    ok = result['status'] == 'ok'
    result['tokens_per_s'] = tokens / (result['time_ms'] / 1e3) if ok else None
    result['gbps'] = ideal_bytes(result) / (result['time_ms'] / 1e3) / 1e9 if ok else None
    result['peak_fraction'] = result['gbps'] / peak_gbps if ok and peak_gbps else None
    result['x_floor'] = result['time_ms'] / result['floor_ms'] if ok and result.get('floor_ms') else None
    return result


def format_row(result, cuda):
    def num(value, fmt):
        return format(value, fmt) if value is not None else '-'

    if result['status'] != 'ok':
        timing = [result['status'] if result['status'] == 'OOM' else 'ERR', '-', '-', '-']
    else:
        timing = [num(result['time_ms'], '.3f'), num(result['tokens_per_s'], '.3e'),
                  num(result['peak_mib'], '.1f'), num(result['x_floor'], '.2f')]
    row = [result['backend'], result['dtype'], str(result['batch']), str(result['heads']),
           str(result['head_dim']), str(result['seq_len'])] + timing
    if cuda:
        frac = result['peak_fraction']
        row.append(num(result['gbps'], '.1f') + (f' ({100 * frac:.0f}%)' if frac else ''))
    note = result['note'] if result['status'] in ('ok', 'OOM') else result['status']
    return row + [note]


def print_table(rows, header):
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    line = '  '.join(h.ljust(w) for h, w in zip(header, widths))
    print(line)
    print('-' * len(line))
    for r in rows:
        print('  '.join(c.ljust(w) for c, w in zip(r, widths)), flush=True)


def check_equal_outputs(args, device):
    """Max |difference| of every pola implementation against pola-torch at a small N."""
    lines = []
    num_tokens = min(min(args.seq_lens), 4096)
    for dtype_name in args.dtypes:
        inputs, rope = make_inputs(1, args.heads[0], num_tokens, args.head_dims[0], DTYPES[dtype_name],
                                   device, rope_setting(args), False)
        reference = build_call('pola-torch', inputs, rope)().float()  # with the (N, 2d) tables
        for backend in ('naive', 'pola-cpu', 'pola-triton'):
            if backend not in args.backends:
                continue
            diff = (build_call(backend, inputs, rope, rope_form=args.rope_form)().float()
                    - reference).abs().max().item()
            rel = diff / reference.abs().max().item()
            lines.append(f'{backend} vs pola-torch ({dtype_name}, N={num_tokens}): max |diff| = '
                         f'{diff:.2e} (relative {rel:.1e})')
    return lines


def write_csv(path, results):
    keys = ['backend', 'dtype', 'batch', 'heads', 'head_dim', 'seq_len', 'rope', 'backward', 'device',
            'time_ms', 'tokens_per_s', 'peak_mib', 'gbps', 'peak_fraction', 'sgemm_gflops', 'floor_ms', 'x_floor',
            'status', 'note']
    with open(path, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=keys, extrasaction='ignore')
        writer.writeheader()
        writer.writerows(results)


def write_plot(path, results):
    """Time and peak memory against N (log-log), one line per backend/dtype/shape."""
    from polaformerpp.analysis import agg_pyplot
    try:
        plt = agg_pyplot()
    except ImportError:
        print('matplotlib is not installed: no plot written')
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    series = {}
    for r in results:
        if r['status'] != 'ok':
            continue
        label = f"{r['backend']} {r['dtype']} B{r['batch']} h{r['heads']} d{r['head_dim']}"
        series.setdefault(label, []).append((r['seq_len'], r['time_ms'], max(r['peak_mib'], 1e-3)))
    for label, points in sorted(series.items()):
        points.sort()
        n, t, m = zip(*points)
        axes[0].plot(n, t, marker='o', label=label)
        axes[1].plot(n, m, marker='o', label=label)
    for ax, ylabel in zip(axes, ('median time (ms)', 'peak memory added (MiB)')):
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.set_xlabel('tokens N')
        ax.set_ylabel(ylabel)
        ax.grid(True, which='both', alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def rope_setting(args):
    return 'off' if args.no_rope else args.rope_form


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == 'cuda'
    backends = list(args.backends)
    if 'pola-triton' in backends and not cuda:
        print('pola-triton: skipped (needs a CUDA device)')
        backends.remove('pola-triton')
    if 'pola-cpu' in backends and (cuda or 'cpu' not in available_backends()):
        print('pola-cpu: skipped (needs CPU tensors and the compiled kernels)')
        backends.remove('pola-cpu')
    args.backends = backends
    peak_gbps = device_peak_gbps(device, args.peak_gbps)
    if args.threads:
        torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name(device) if cuda else f'CPU ({torch.get_num_threads()} threads)'
    print(f'device: {name}' + (f', peak {peak_gbps:.0f} GB/s' if peak_gbps else '')
          + f"; {'forward + backward' if args.backward else 'forward'}; "
          f"rope {rope_setting(args)} (pola backends); median of {args.repeat}")
    for line in check_equal_outputs(args, device):
        print(line)

    header = ['backend', 'dtype', 'B', 'h', 'd', 'N', 'time ms', 'tokens/s', 'peak MiB', 'x floor']
    header += ['GB/s (of peak)'] if cuda else []
    header += ['note']
    results, rows = [], []
    isolate = not cuda and not args.no_isolate
    grid = list(itertools.product(args.dtypes, args.batch_sizes, args.heads, args.head_dims, args.seq_lens,
                                  backends))
    grid += [(dtype_name, batch, heads, head_dim, seq_len, backend) for dtype_name, (batch, heads, seq_len), head_dim,
             backend in itertools.product(args.dtypes, args.shapes, args.head_dims, backends)]
    with ProgressBar(len(grid), f'{len(grid)} cells', enabled=progress_from_args(args)) as bar:
        for dtype_name, batch, heads, head_dim, seq_len, backend in grid:
            cell = dict(backend=backend, dtype=dtype_name, batch=batch, heads=heads, head_dim=head_dim,
                        seq_len=seq_len, rope=rope_setting(args), backward=args.backward, device=str(device),
                        repeat=args.repeat, warmup=args.warmup, threads=args.threads)
            result = measure_cell_isolated(cell) if isolate else measure_cell(cell)
            results.append(add_derived(result, peak_gbps))
            rows.append(format_row(result, cuda))
            bar.update()
    print()
    print_table(rows, header)

    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        csv_path = osp.join(args.out_dir, 'benchmark_attention.csv')
        write_csv(csv_path, results)
        print(f'\nwrote {csv_path}')
        png_path = osp.join(args.out_dir, 'benchmark_attention.png')
        if write_plot(png_path, results):
            print(f'wrote {png_path}')
    return results


if __name__ == '__main__':
    run_cli(main)
