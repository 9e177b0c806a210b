"""tools/slurm_train.sh and tools/slurm_test.sh through a stand-in ``srun``; the Slurm rendezvous.

The stand-in ``srun`` (written into the test's temporary folder and put first on
PATH) records its arguments and starts ``--ntasks`` local copies of its command
with the variables a real srun sets (``SLURM_PROCID``, ``SLURM_LOCALID``,
``SLURM_NTASKS``, ``SLURM_NODELIST``); the stand-in ``scontrol`` resolves the
node list to ``localhost``. The tools then run with ``--launcher slurm`` on the
CPU (gloo), as on a cluster node.
"""
import json
import os
import os.path as osp
import stat
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, free_port, run_tool
from polaformerpp.utils.runtime import slurm_dist_env

DEMO_CONFIG = 'configs/classification/polapp-b0_1xb32-30e_demo-shapes.py'

FAKE_SRUN = '''#!{python}
"""Stand-in for Slurm's srun on one node: records argv, runs --ntasks copies of the command."""
import json
import os
import subprocess
import sys
import time

VALUE_OPTIONS = {{'-p', '--partition', '-J', '--job-name', '-n', '--ntasks', '-c', '--cpus-per-task',
                  '--gres', '--ntasks-per-node', '-t', '--time', '-N', '--nodes'}}
args = sys.argv[1:]
with open(os.environ['FAKE_SRUN_LOG'], 'a') as f:
    f.write(json.dumps(args) + '\\n')
options, i = {{}}, 0
while i < len(args) and args[i].startswith('-'):
    if '=' in args[i]:
        key, value = args[i].split('=', 1)
    elif args[i] in VALUE_OPTIONS:
        key, value = args[i], args[i + 1]
        i += 1
    else:
        key, value = args[i], ''
    options[key] = value
    i += 1
command = args[i:]
if not command:
    sys.exit('srun: no command')
if os.environ.get('FAKE_SRUN_DRY'):
    sys.exit(0)
ntasks = int(options.get('--ntasks', options.get('-n', 1)))
procs = []
for rank in range(ntasks):
    env = dict(os.environ, SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_NTASKS=str(ntasks),
               SLURM_NODELIST='localhost', SLURM_NNODES='1',
               SLURM_JOB_NAME=options.get('--job-name', options.get('-J', '')))
    procs.append(subprocess.Popen(command, env=env))
# --kill-on-bad-exit=1: once a task fails, end the others instead of leaving them waiting
while any(p.poll() is None for p in procs):
    if any(p.poll() not in (None, 0) for p in procs):
        for p in procs:
            if p.poll() is None:
                p.terminate()
    time.sleep(0.2)
sys.exit(max(abs(p.returncode) for p in procs))
'''

FAKE_SCONTROL = '''#!/bin/sh
# Stand-in for `scontrol show hostname NODELIST`: one host per line.
echo "$*" >> "$FAKE_SCONTROL_LOG"
if [ "$1" = show ] && [ "$2" = hostname ]; then
    echo localhost
    exit 0
fi
echo "scontrol: unsupported: $*" >&2
exit 1
'''


def write_executable(path, text):
    with open(path, 'w') as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """A folder with ``srun`` and ``scontrol`` stand-ins, first on PATH; returns the log paths."""
    bin_dir = tmp_path / 'slurm_bin'
    bin_dir.mkdir()
    write_executable(bin_dir / 'srun', FAKE_SRUN.format(python=sys.executable))
    write_executable(bin_dir / 'scontrol', FAKE_SCONTROL)
    logs = dict(srun=str(tmp_path / 'srun_argv.jsonl'), scontrol=str(tmp_path / 'scontrol_calls.txt'))
    monkeypatch.setenv('PATH', f'{bin_dir}{os.pathsep}{os.environ["PATH"]}')
    monkeypatch.setenv('FAKE_SRUN_LOG', logs['srun'])
    monkeypatch.setenv('FAKE_SCONTROL_LOG', logs['scontrol'])
    for name in ('MASTER_ADDR', 'MASTER_PORT', 'RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'SLURM_PROCID',
                 'SLURM_NTASKS', 'SLURM_LOCALID', 'SLURM_NODELIST', 'GPUS', 'GPUS_PER_NODE',
                 'CPUS_PER_TASK', 'SRUN_ARGS'):
        monkeypatch.delenv(name, raising=False)
    return logs


def recorded_argv(log):
    with open(log) as f:
        return [json.loads(line) for line in f if line.strip()]


def srun_head(partition, job, gpus, per_node, cpus):
    return ['-p', partition, f'--job-name={job}', f'--gres=gpu:{per_node}', f'--ntasks={gpus}',
            f'--ntasks-per-node={per_node}', f'--cpus-per-task={cpus}', '--kill-on-bad-exit=1']


# --- the scripts' srun command lines (no processes started) ---


def test_slurm_train_srun_arguments(fake_slurm):
    train_py = osp.join(REPO_ROOT, 'tools', 'train.py')
    run_tool(['tools/slurm_train.sh', 'gpu-part', 'polapp-b0', DEMO_CONFIG, 'work_dirs/w', '--amp',
              '--cfg-options', 'train_cfg.max_epochs=2'], env=dict(FAKE_SRUN_DRY='1', PYTHON='mypython'))
    run_tool(['tools/slurm_train.sh', 'p2', 'j2', DEMO_CONFIG, 'w2'],
             env=dict(FAKE_SRUN_DRY='1', PYTHON='mypython', GPUS='16', GPUS_PER_NODE='4', CPUS_PER_TASK='3',
                      SRUN_ARGS='--time=1:00:00 --exclusive'))
    default, custom = recorded_argv(fake_slurm['srun'])
    assert default == [*srun_head('gpu-part', 'polapp-b0', 8, 8, 5), 'mypython', '-u', train_py, DEMO_CONFIG,
                       '--work-dir=work_dirs/w', '--launcher=slurm', '--amp', '--cfg-options',
                       'train_cfg.max_epochs=2']
    assert custom == [*srun_head('p2', 'j2', 16, 4, 3), '--time=1:00:00', '--exclusive', 'mypython', '-u',
                      train_py, DEMO_CONFIG, '--work-dir=w2', '--launcher=slurm']


def test_slurm_test_srun_arguments(fake_slurm):
    test_py = osp.join(REPO_ROOT, 'tools', 'test.py')
    run_tool(['tools/slurm_test.sh', 'p', 'eval', DEMO_CONFIG, 'ckpt.pth', '--out-json', 'm.json'],
             env=dict(FAKE_SRUN_DRY='1', PYTHON='py', GPUS='2', GPUS_PER_NODE='2'))
    (argv, ) = recorded_argv(fake_slurm['srun'])
    assert argv == [*srun_head('p', 'eval', 2, 2, 5), 'py', '-u', test_py, DEMO_CONFIG, 'ckpt.pth',
                    '--launcher=slurm', '--out-json', 'm.json']


@pytest.mark.parametrize('script', ['tools/slurm_train.sh', 'tools/slurm_test.sh'])
def test_slurm_scripts_need_four_arguments(script, fake_slurm):
    proc = subprocess.run(['bash', script, 'part', 'job', DEMO_CONFIG], cwd=REPO_ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 2
    assert 'usage:' in proc.stderr and 'PARTITION JOB_NAME CONFIG' in proc.stderr
    assert not osp.exists(fake_slurm['srun'])


# --- Slurm variables -> torch.distributed's ---


def test_slurm_dist_env_from_task_variables(fake_slurm):
    env = slurm_dist_env(dict(SLURM_PROCID='3', SLURM_NTASKS='8', SLURM_LOCALID='1', SLURM_NODELIST='node[01-02]'))
    assert env == dict(MASTER_ADDR='localhost', MASTER_PORT='29500', RANK='3', WORLD_SIZE='8', LOCAL_RANK='1')
    with open(fake_slurm['scontrol']) as f:
        assert f.read().split() == ['show', 'hostname', 'node[01-02]']


def test_slurm_dist_env_keeps_master_addr_and_port(fake_slurm):
    env = slurm_dist_env(dict(SLURM_PROCID='0', SLURM_NTASKS='2', SLURM_NODELIST='node01',
                              MASTER_ADDR='10.0.0.7', MASTER_PORT='23456'))
    assert env == dict(MASTER_ADDR='10.0.0.7', MASTER_PORT='23456', RANK='0', WORLD_SIZE='2', LOCAL_RANK='0')
    assert not osp.exists(fake_slurm['scontrol'])


def test_slurm_dist_env_errors(fake_slurm, monkeypatch):
    with pytest.raises(KeyError, match='SLURM_PROCID'):
        slurm_dist_env(dict(SLURM_NTASKS='2', SLURM_NODELIST='n'))
    with pytest.raises(ValueError, match='SLURM_NTASKS must be an integer'):
        slurm_dist_env(dict(SLURM_PROCID='0', SLURM_NTASKS='two', SLURM_NODELIST='n'))
    with pytest.raises(ValueError, match=r'SLURM_PROCID must be in \[0, SLURM_NTASKS=2\)'):
        slurm_dist_env(dict(SLURM_PROCID='2', SLURM_NTASKS='2', SLURM_NODELIST='n'))
    with pytest.raises(KeyError, match='SLURM_NODELIST'):
        slurm_dist_env(dict(SLURM_PROCID='0', SLURM_NTASKS='2'))
    monkeypatch.setenv('PATH', '/nonexistent')
    with pytest.raises(RuntimeError, match='scontrol is not on PATH; set MASTER_ADDR'):
        slurm_dist_env(dict(SLURM_PROCID='0', SLURM_NTASKS='2', SLURM_NODELIST='n'))


# --- end to end: 2 srun tasks train and evaluate on the CPU ---


def data_options(root, size=32):
    """Point the demo config at ``root``, at ``size`` px, with a tiny arch and one short epoch."""
    options = []
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        options += [f'{key}.dataset.data_root={root}', f'{key}.num_workers=0']
    options += [f'train_dataloader.dataset.pipeline.1.scale={size}']
    for key in ('val_dataloader', 'test_dataloader'):
        options += [f'{key}.dataset.pipeline.1.scale={size}', f'{key}.dataset.pipeline.2.crop_size={size}']
    options += ['model.backbone.arch._delete_=True', 'model.backbone.arch.embed_dims=[16,32,48,64]',
                'model.backbone.arch.depths=[1,1,1,1]', 'model.backbone.arch.num_heads=[1,2,2,4]',
                'model.backbone.arch.cls_proj_channels=64', 'model.head.in_channels=64']
    return options


@pytest.mark.slow
def test_slurm_train_and_test_two_tasks(demo_in1k, tmp_path, fake_slurm):
    work_dir = str(tmp_path / 'slurm_work')
    proc = run_tool(['tools/slurm_train.sh', 'dummy', 'job', DEMO_CONFIG, work_dir, '--cfg-options',
                     *data_options(demo_in1k), 'train_cfg.max_epochs=1', 'train_cfg.val_interval=1',
                     'train_dataloader.batch_size=16', 'default_hooks.checkpoint.interval=1'],
                    env=dict(GPUS='2', GPUS_PER_NODE='2', MASTER_PORT=str(free_port()), OMP_NUM_THREADS='1',
                             PYTHON=sys.executable))
    log = proc.stdout + proc.stderr
    assert 'Distributed launcher: slurm' in log and 'Distributed training: True' in log, log[-3000:]
    assert 'GPU number: 2' in log, log[-3000:]
    assert osp.isfile(osp.join(work_dir, 'epoch_1.pth'))
    (argv, ) = recorded_argv(fake_slurm['srun'])
    assert argv[:8] == srun_head('dummy', 'job', 2, 2, 5)
    assert argv[8:13] == [sys.executable, '-u', osp.join(REPO_ROOT, 'tools', 'train.py'), DEMO_CONFIG,
                          f'--work-dir={work_dir}']
    # MASTER_ADDR was not set: each task resolved the node list through scontrol
    with open(fake_slurm['scontrol']) as f:
        assert f.read().splitlines() == ['show hostname localhost'] * 2

    metrics_file = str(tmp_path / 'slurm_metrics.json')
    proc = run_tool(['tools/slurm_test.sh', 'dummy', 'eval', DEMO_CONFIG, osp.join(work_dir, 'epoch_1.pth'),
                     '--work-dir', str(tmp_path / 'slurm_test'), '--out-json', metrics_file,
                     '--cfg-options', *data_options(demo_in1k)],
                    env=dict(GPUS='2', GPUS_PER_NODE='2', MASTER_ADDR='127.0.0.1', MASTER_PORT=str(free_port()),
                             OMP_NUM_THREADS='1'))
    assert 'GPU number: 2' in proc.stdout + proc.stderr
    with open(metrics_file) as f:
        assert 0.0 <= json.load(f)['accuracy/top1'] <= 100.0
    assert len(recorded_argv(fake_slurm['srun'])) == 2
