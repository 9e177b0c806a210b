"""Helpers shared by the test folders (imported as ``from conftest import ...``).

The package is installed in editable mode in the environment, so neither the
tests nor the tools they run need the repository on ``sys.path``.
"""
import contextlib
import os
import os.path as osp
import socket
import subprocess
import sys
from typing import Any, NamedTuple

import pytest

# Triton kernels run on CPU tensors through the interpreter; the mode is fixed when
# triton is first imported, so it is set before anything imports it.
try:
    import torch as _torch
    if not _torch.cuda.is_available():
        os.environ.setdefault('TRITON_INTERPRET', '1')
except ImportError:  # pragma: no cover
    pass

#: Under pytest-xdist (``make test``) each worker runs on one intra-op thread, and so do the
#: tools it starts: workers on cores of their own rather than OpenMP teams fighting over shared ones.
if os.environ.get('PYTEST_XDIST_WORKER'):
    os.environ['OMP_NUM_THREADS'] = '1'
    if 'torch' in sys.modules:
        sys.modules['torch'].set_num_threads(1)

#: the repository root (configs and tools are addressed relative to it)
REPO_ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..'))
#: one block of each attention type: linear attention in stage 2, softmax in stage 3; stages 1 and
#: 4 keep their downsampling and norms. The smallest layout that builds every kind of layer, for
#: tests whose cost grows with the graph (compiling, exporting)
ONE_BLOCK_PER_ATTENTION_TYPE = [0, 1, 1, 0]
#: the tiny widths and heads on that layout: two heads in each block
TWO_BLOCK_ARCH = dict(embed_dims=[16, 32, 48, 64], depths=ONE_BLOCK_PER_ATTENTION_TYPE, num_heads=[1, 2, 2, 4])


def linear_backbones(*backends, seed=0):
    """Tiny all-linear-attention PolaFormerPP models in eval mode, one per attention backend,
    with the same weights and spread temperatures (they start at 0, i.e. 0.5 after the sigmoid)."""
    import torch

    from polaformerpp.models.backbones import PolaFormerPP

    def build(backend):
        return PolaFormerPP(arch=dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 4]),
                            out_indices=(0, 1, 2, 3), attn_types=('linear', ) * 4,
                            attn_backend=backend).eval()

    torch.manual_seed(seed)
    models = [build(backend) for backend in backends]
    state = models[0].state_dict()
    for name in state:
        if name.endswith(('temp_same', 'temp_opp')):
            state[name] = torch.randn_like(state[name])
    for model in models:
        model.load_state_dict(state)
    return models


def load_tool(relpath):
    """Import a script under ``tools/`` as a module (tools/ is not a package)."""
    import importlib.util
    path = osp.join(REPO_ROOT, relpath)
    name = 'polapp_tool_' + osp.splitext(osp.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_tool(args, cwd=None, env=None, timeout=1800):
    """Run ``python <args...>`` (or a shell script) from the repo root; fail with its output.

    The child uses this interpreter (``PYTHON`` for the shell scripts), so it
    finds the package installed in the same environment.
    """
    full_env = dict(os.environ)
    full_env.setdefault('PYTHON', sys.executable)
    full_env['OMP_NUM_THREADS'] = full_env.get('OMP_NUM_THREADS', '2')
    if env:
        full_env.update(env)
    cmd = ['bash', *args] if args[0].endswith('.sh') else [sys.executable, *args]
    proc = subprocess.run(cmd, cwd=cwd or REPO_ROOT, env=full_env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f'{" ".join(cmd)} exited {proc.returncode}\n--- stdout ---\n{proc.stdout[-6000:]}'
                    f'\n--- stderr ---\n{proc.stderr[-6000:]}')
    return proc


class ToolRun(NamedTuple):
    """What :func:`call_tool` returns: the tool's printed output and ``main``'s return value."""
    stdout: str
    stderr: str
    result: Any


def call_tool(args, env=None):
    """Run ``python <args...>`` in this process: the tool's ``main(argv)``; fail with its output.

    For the runs where the process itself is not what is tested (for exit codes,
    signals and launchers use :func:`run_tool`): the same code from the parsed
    arguments on, from the repo root, without a new interpreter importing torch
    and the libraries again (about 4 s a run on a small CPU). ``args[0]`` is the
    tool's path from the repo root. ``env`` is set for the run (its
    ``OMP_NUM_THREADS`` sets the run's intra-op threads) and restored after it,
    with everything else a run changes in the process (:func:`process_state_kept`).
    """
    import io

    import torch

    tool = load_tool(args[0])
    env = dict(env or {})
    out, err = io.StringIO(), io.StringIO()
    with process_state_kept():
        os.environ.update(env)
        os.chdir(REPO_ROOT)
        if 'OMP_NUM_THREADS' in env:
            torch.set_num_threads(int(env['OMP_NUM_THREADS']))
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                result = tool.main(list(args[1:]))
        except SystemExit as stop:
            result = stop.code
            if stop.code not in (None, 0):
                pytest.fail(f'{" ".join(args)} exited {stop.code}\n--- stdout ---\n{out.getvalue()[-6000:]}'
                            f'\n--- stderr ---\n{err.getvalue()[-6000:]}')
        except BaseException:
            sys.stdout.write(out.getvalue()[-6000:])
            sys.stderr.write(err.getvalue()[-6000:])
            raise
    return ToolRun(out.getvalue(), err.getvalue(), result)


@contextlib.contextmanager
def process_state_kept():
    """Run a block as a new process would, and put back on leaving what it changed.

    Inside, mmengine's named instances (loggers, message hubs, visualizers,
    default scopes) start empty: a Runner would otherwise get an earlier test's
    visualizer of the same name and write to that test's folder. On leaving,
    those made inside are closed and the earlier ones put back; the environment,
    the working folder, the random generators, the deterministic and cuDNN
    flags, the torch and OpenCV thread counts, the multiprocessing start method,
    what ``gc.freeze`` holds (the run's own objects are collected, the earlier
    ones frozen again) and the unsafe-loading switch are restored. mmengine names a
    run's log folder and logger after the second it starts: a block entered in
    the second the last one was entered waits for the next second.
    """
    import gc
    import logging
    import multiprocessing
    import random
    import time
    import warnings

    import cv2
    import numpy as np
    import torch
    from mmengine.utils import ManagerMixin

    from polaformerpp.utils import set_unsafe_loading

    def managed_classes(cls=ManagerMixin):
        for sub in cls.__subclasses__():
            yield sub
            yield from managed_classes(sub)

    while int(time.time()) == _last_run_second[0]:
        time.sleep(0.05)
    _last_run_second[0] = int(time.time())
    environ, cwd, threads = dict(os.environ), os.getcwd(), torch.get_num_threads()
    rng = random.getstate(), np.random.get_state(), torch.get_rng_state()
    deterministic = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    cudnn = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
    cv2_threads, start_method = cv2.getNumThreads(), multiprocessing.get_start_method(allow_none=True)
    frozen_before = gc.get_freeze_count() > 0
    instances = {cls: dict(cls._instance_dict) for cls in managed_classes()}
    for cls in instances:
        cls._instance_dict.clear()
    try:
        with warnings.catch_warnings():
            yield
    finally:
        for cls in managed_classes():
            for instance in cls._instance_dict.values():
                if isinstance(instance, logging.Logger):
                    for handler in list(instance.handlers):
                        handler.close()
                        instance.removeHandler(handler)
                elif hasattr(instance, 'close'):
                    instance.close()
            cls._instance_dict.clear()
            cls._instance_dict.update(instances.get(cls, {}))
        # the tools freeze what they hold (freeze_long_lived_objects): free the run's garbage, then
        # freeze again what this process held before it, as the session did after collecting
        gc.unfreeze()
        gc.collect()
        if frozen_before:
            gc.freeze()
        set_unsafe_loading(False)
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = cudnn
        torch.set_num_threads(threads)
        cv2.setNumThreads(cv2_threads)
        multiprocessing.set_start_method(start_method, force=True)


#: the second (``int(time.time())``) the last :func:`process_state_kept` block was entered
_last_run_second = [0]


def free_port():
    """A TCP port on 127.0.0.1 that is free right now (for torchrun's ``--master_port``)."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def built_once(tmp_path_factory, name, build):
    """The folder ``build(folder)`` filled, built once per test run even under pytest-xdist.

    A session or module fixture runs once in each xdist worker; what it writes is the
    same in all of them. The first worker to ask builds it under a file lock in the
    run's shared temporary folder, the others wait for it and read the same files.
    Without xdist the folder is this session's own. ``build`` returns nothing; what it
    leaves in ``folder`` is the result (a half-built folder is never handed out: the
    marker is written after ``build`` returns, and a failed build is retried by the next
    worker that asks, which then fails the same way).
    """
    from filelock import FileLock
    root = tmp_path_factory.getbasetemp()
    if os.environ.get('PYTEST_XDIST_WORKER'):
        root = root.parent  # the run's folder above the workers' own
    folder = root / f'built_once_{name}'
    with FileLock(str(folder) + '.lock'):
        done = folder / '.built'
        if not done.is_file():
            if folder.exists():
                import shutil
                shutil.rmtree(folder)
            folder.mkdir()
            build(folder)
            done.write_text('ok\n')
    return folder


@pytest.fixture(scope='session')
def demo_in1k(tmp_path_factory):
    """The generated ImageNet-format shapes set (4 classes, 64 px)."""
    make_demo_data = load_tool('tools/misc/make_demo_data.py').make_demo_data
    root = str(tmp_path_factory.mktemp('demo_in1k'))
    make_demo_data(root, num_classes=4, train_per_class=40, val_per_class=10, size=64, seed=0)
    return root


def in_new_interpreter(fn, *args, timeout=900):
    """``fn(*args)`` run in a new Python interpreter (multiprocessing's spawn); its return value.

    For a check that loads native code of its own making into the process (inductor's generated
    C++ libraries): the test worker that runs hundreds of other tests never loads it, and a crash
    there fails this one test with its cause instead of taking the worker down. ``fn`` must be a
    module-level function (the child imports its module). An exception in the child is raised
    here with the child's traceback; a child that dies (a signal, ``os._exit``) or outlives
    ``timeout`` seconds fails the test with its exit status and what it wrote to stderr, where
    ``faulthandler`` prints every thread's Python stack on a fatal signal.
    """
    import multiprocessing
    import tempfile

    context = multiprocessing.get_context('spawn')
    receive, send = context.Pipe(duplex=False)
    with tempfile.NamedTemporaryFile('w+', prefix='child_stderr_', suffix='.txt') as stderr:
        child = context.Process(target=_child_main, args=(send, stderr.name, fn, args), daemon=True)
        child.start()
        send.close()
        outcome = None
        if receive.poll(timeout):
            try:
                outcome = receive.recv()
            except EOFError:  # the child died before sending anything
                pass
        child.join(10 if outcome is not None else 1)
        if child.is_alive():
            child.kill()
            child.join()
        if outcome is None:
            code = child.exitcode
            how = (f'killed by {_signal_name(-code)}' if code is not None and code < 0
                   else f'exit status {code}' if code is not None else f'still running after {timeout} s')
            stderr.seek(0)
            pytest.fail(f'{fn.__module__}.{fn.__qualname__} ran in a new interpreter that ended without a '
                        f'result ({how}); its stderr:\n{stderr.read()[-8000:]}')
    ok, value = outcome
    if ok:
        return value
    error, child_traceback = value
    raise error from _ChildTraceback(child_traceback)


class _ChildTraceback(Exception):
    """The traceback of an exception raised in :func:`in_new_interpreter`'s child, as text."""

    def __str__(self):
        return '\n' + self.args[0]


def _signal_name(number):
    import signal
    try:
        return signal.Signals(number).name
    except ValueError:
        return f'signal {number}'


def _child_main(send, stderr_path, fn, args):
    """The child of :func:`in_new_interpreter`: stderr to a file, fatal-signal stacks on, one result sent."""
    import faulthandler
    import traceback

    stderr = open(stderr_path, 'w', buffering=1)
    os.dup2(stderr.fileno(), 2)
    sys.stderr = stderr
    faulthandler.enable(file=stderr, all_threads=True)
    try:
        outcome = (True, fn(*args))
    except BaseException as error:  # noqa: B902 (everything goes back to the test)
        details = ''.join(traceback.format_exception(error))
        try:
            import pickle
            pickle.dumps(error)
        except Exception:
            error = AssertionError(f'{type(error).__name__}: {error}')
        outcome = (False, (error, details))
    send.send(outcome)
    send.close()


# ----------------------------------------------------------------------------- schedule and budget
#: Seconds a test may take on the reference machine (2 cores, AVX2, float32 sgemm ~130 GFLOP/s,
#: one pytest-xdist worker per core): README, "Tests". The run lists the tests past them.
TEST_BUDGET_S = {'fast': 5.0, 'slow': 90.0}
_over_budget = []
_setup_seconds = {}


def pytest_report_header(config):
    """The machine the figures come from: CPU model, vector ISA, float32 sgemm rate (README, "Tests").

    The rate is the benchmark tools' (:func:`polaformerpp.analysis.sgemm_seconds`), median of 9.
    """
    import statistics

    import torch

    from polaformerpp.analysis import SGEMM_SIZE, sgemm_gflops, sgemm_seconds
    model, flags = 'unknown', set()
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                key, _, value = line.partition(':')
                if key.strip() == 'model name':
                    model = value.strip()
                elif key.strip() == 'flags':
                    flags = set(value.split())
                    break
    except OSError:
        pass
    isa = [flag for flag in ('avx2', 'fma', 'avx512f', 'avx512_bf16', 'amx_tile') if flag in flags]
    sgemm = sgemm_seconds('cpu')  # warms up once
    gflops = sgemm_gflops(statistics.median(sgemm() for _ in range(9)))
    return [f'cpu: {model}, {os.cpu_count()} cores, flags {" ".join(isa) or "(none of avx2/avx512)"}, '
            f'torch on {torch.backends.cpu.get_cpu_capability()}',
            f'float32 sgemm {SGEMM_SIZE}^3 on {torch.get_num_threads()} threads: {gflops:.0f} GFLOP/s (median of 9)']


def pytest_collection_finish(session):
    """Freeze what collecting imported (torch and the OpenMMLab libraries, some 300,000 objects).

    mmengine's datasets run a full garbage collection each time one is built; it then walks only
    what the test made, not every object of the libraries. :func:`process_state_kept` freezes it
    again after an in-process tool run.
    """
    import gc
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    """End-to-end (``slow``) tests first, each group in file order.

    Under pytest-xdist (``--dist load --maxschedchunk 1``) the longest runs then
    start at once and the many short tests fill in around them, instead of one
    long run starting last while the other workers idle.
    """
    items.sort(key=lambda item: item.get_closest_marker('slow') is None)


def pytest_runtest_logreport(report):
    """Note each test whose setup (fixtures) and call took longer than its kind's budget."""
    if report.when == 'setup':
        _setup_seconds[report.nodeid] = report.duration
    elif report.when == 'call':
        kind = 'slow' if 'slow' in report.keywords else 'fast'
        seconds = _setup_seconds.pop(report.nodeid, 0.0) + report.duration
        if seconds > TEST_BUDGET_S[kind]:
            _over_budget.append((seconds, kind, report.nodeid))


def pytest_terminal_summary(terminalreporter):
    if not _over_budget:
        return
    terminalreporter.write_sep('=', 'tests over their budget (README, "Tests")')
    for seconds, kind, nodeid in sorted(_over_budget, reverse=True):
        terminalreporter.write_line(f'{seconds:7.1f}s > {TEST_BUDGET_S[kind]:.0f}s ({kind})  {nodeid}')
