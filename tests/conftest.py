"""Helpers shared by the test folders (imported as ``from conftest import ...``).

The package is installed in editable mode in the environment, so neither the
tests nor the tools they run need the repository on ``sys.path``.
"""
import os
import os.path as osp
import socket
import subprocess
import sys

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


# ----------------------------------------------------------------------------- schedule and budget
#: Seconds a test may take on the reference machine (2 cores, AVX2, float32 sgemm ~130 GFLOP/s,
#: one pytest-xdist worker per core): README, "Tests". The run lists the tests past them.
TEST_BUDGET_S = {'fast': 5.0, 'slow': 90.0}
_over_budget = []
_setup_seconds = {}


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
