"""Restarts after a lost worker: ``tools/dist_train.sh`` over torchrun with elastic restarts.

Two CPU processes (gloo) train the classification demo config; rank 1 SIGKILLs
itself in the middle of an epoch on the first attempt (a test-only hook written
into the test's folder and loaded through ``custom_imports``). torchrun must
stop the group, start it again (``MAX_RESTARTS``), and the restarted workers
resume from the latest checkpoint of the work dir by themselves (no
``--resume`` on the command line); the run finishes every epoch, its final
checkpoint loads into the model. (That a resumed run equals an uninterrupted one
bit for bit is checked in test_exact_resume.py.)
"""
import glob
import json
import os
import os.path as osp
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import REPO_ROOT, free_port

DEMO_CONFIG = 'configs/classification/polapp-b0_1xb32-30e_demo-shapes.py'

#: the test-only hook: on the first attempt (no restart yet) one rank kills itself for real
KILL_HOOK = '''
"""Test-only: SIGKILL one rank before a given training iteration, on the first attempt only."""
import os
import signal

from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class KillOneWorkerHook(Hook):
    priority = 'LOWEST'

    def __init__(self, rank, at_iter):
        self.rank = rank
        self.at_iter = at_iter

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        first_attempt = os.environ.get('TORCHELASTIC_RESTART_COUNT', '0') == '0'
        if first_attempt and get_rank() == self.rank and runner.iter == self.at_iter:
            with open(os.environ['LOST_WORKER_MARKER'], 'w') as f:
                f.write(f'rank {self.rank} pid {os.getpid()} killed before iter {runner.iter}')
            os.kill(os.getpid(), signal.SIGKILL)
'''


def process_tree(root_pid):
    """``root_pid`` and all its descendants alive now (Linux ``/proc``), parents first."""
    children = {}
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open(f'/proc/{entry}/stat') as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(')', 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def kill_tree(root_pid):
    """SIGKILL ``root_pid`` and every descendant (torchrun starts each worker in its own session)."""
    for pid in process_tree(root_pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_dist_train(args, env, timeout):
    """``bash tools/dist_train.sh ARGS``; the whole process tree is killed on a timeout."""
    proc = subprocess.Popen(['bash', 'tools/dist_train.sh', *args], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, _ = proc.communicate()
        pytest.fail(f'dist_train.sh did not finish in {timeout} s\n{out[-6000:]}')
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()
    return proc.returncode, out


EPOCHS, ITERS_PER_EPOCH = 2, 4  # 64 images, 8 per rank and batch, 2 ranks


def train_two_workers(demo_root, tmp_path, name, kill_at, max_restarts):
    """Train the demo config with 2 CPU workers in ``tmp_path/name``; rank 1 SIGKILLs itself
    before iteration ``kill_at`` (0-based, first attempt only; -1: never).

    Returns ``(work_dir, log, marker)``: the work dir, torchrun's and the workers' output,
    and the file the hook writes when it kills.
    """
    root = tmp_path / name
    hooks_dir = root / 'hooks'
    hooks_dir.mkdir(parents=True)
    (hooks_dir / 'lost_worker_hook.py').write_text(KILL_HOOK)
    config = root / 'lost_worker.py'
    config.write_text(textwrap.dedent(f'''\
        _base_ = [{osp.join(REPO_ROOT, DEMO_CONFIG)!r}]
        custom_imports = dict(imports=['polaformerpp', 'polaformerpp.engine', 'lost_worker_hook'],
                              allow_failed_imports=False)
        custom_hooks = [dict(type='KillOneWorkerHook', rank=1, at_iter={kill_at})]
        '''))
    options = []
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        options += [f'{key}.dataset.data_root={demo_root}', f'{key}.num_workers=0']
    options += ['train_dataloader.dataset.pipeline.1.scale=32', 'train_dataloader.dataset.indices=64',
                'train_dataloader.batch_size=8', f'train_cfg.max_epochs={EPOCHS}',
                'param_scheduler.0.end=1', 'param_scheduler.1.begin=1',
                f'param_scheduler.1.end={EPOCHS}', f'param_scheduler.1.T_max={EPOCHS - 1}',
                'default_hooks.checkpoint.interval=1', 'default_hooks.checkpoint.max_keep_ckpts=5',
                'default_hooks.checkpoint.save_best=None', 'default_hooks.logger.interval=1',
                'randomness.deterministic=True']
    marker = root / 'killed.txt'
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS='1', PORT=str(free_port()),
               MAX_RESTARTS=str(max_restarts), LOST_WORKER_MARKER=str(marker),
               PYTHONPATH=os.pathsep.join(p for p in (str(hooks_dir), os.environ.get('PYTHONPATH')) if p))
    env.pop('TORCHELASTIC_RESTART_COUNT', None)
    work_dir = root / 'work'
    returncode, log = run_dist_train([str(config), '2', '--work-dir', str(work_dir), '--no-validate',
                                      '--cfg-options', *options], env, timeout=240)
    assert returncode == 0, log[-6000:]
    return work_dir, log, marker


def logged_losses(work_dir):
    """``{iter: loss}`` from every attempt's ``vis_data/scalars.json`` in ``work_dir``
    (an iteration logged by two attempts must have logged the same loss)."""
    losses = {}
    for path in sorted(glob.glob(osp.join(str(work_dir), '*', 'vis_data', 'scalars.json'))):
        with open(path) as f:
            for record in (json.loads(line) for line in f if line.strip()):
                if 'loss' in record:
                    assert losses.setdefault(record['iter'], record['loss']) == record['loss'], (path, record)
    return losses


@pytest.mark.slow
def test_lost_worker_restarts_and_resumes(demo_in1k, tmp_path):
    # rank 1 dies before iteration 6 (0-based: the middle of the last epoch), after epoch_1.pth was written
    kill_at = 6
    work_dir, log, marker = train_two_workers(demo_in1k, tmp_path, 'killed', kill_at, max_restarts=2)

    # the worker was really lost, torchrun noticed and restarted the group once, and the
    # restarted workers resumed from the latest checkpoint without being told to
    assert marker.read_text().startswith('rank 1 pid '), marker.read_text()
    assert 'exitcode: -9' in log, log[-6000:]
    assert "this agent's restart 1): resuming from the latest checkpoint" in log, log[-6000:]
    assert f'resumed epoch: 1, iter: {ITERS_PER_EPOCH}' in log, log[-6000:]
    # (on failure: the output before the second restart, where the restarted group failed,
    # without the optimizer's per-parameter lines)
    before_second = [line for line in log[:log.find("this agent's restart 2")].splitlines()
                     if 'paramwise_options' not in line]
    assert "this agent's restart 2" not in log, '\n'.join(before_second)[-8000:]

    # the run finished every epoch, and its final checkpoint is whole and loads into the model
    final = work_dir / f'epoch_{EPOCHS}.pth'
    assert final.is_file(), sorted(os.listdir(work_dir))
    import polaformerpp  # noqa: F401  (registers the types of Runner checkpoints for weights_only)
    checkpoint = torch.load(str(final), map_location='cpu', weights_only=True)
    assert checkpoint['meta']['epoch'] == EPOCHS
    assert checkpoint['meta']['iter'] == EPOCHS * ITERS_PER_EPOCH

    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    init_default_scope('mmpretrain')
    model = MODELS.build(Config.fromfile(osp.join(REPO_ROOT, DEMO_CONFIG)).model)
    model.load_state_dict(checkpoint['state_dict'], strict=True)

    # every iteration was logged, and one logged by both attempts logged the same loss
    assert sorted(logged_losses(work_dir)) == list(range(1, EPOCHS * ITERS_PER_EPOCH + 1))
