"""Multi-node faults: one resumption decision per job, stalls that end, messages that name what broke.

The slow tests run real processes: two torchrun agents started by
``tools/dist_train.sh`` with ``NNODES=2`` stand in for two nodes (c10d
rendezvous, gloo, one worker each); one "node" is killed (its agent's whole
process tree) and started again, and the job must end with the weights of an
uninterrupted two-node run, bit for bit. A frozen peer (SIGSTOP) must end the
job within the configured collective timeout with a line naming it, and a full
disk (a real tmpfs) must stop a run with the checkpoint's path and the free
space of its folder. The fast tests cover the rules and messages in-process.
"""
import json
import os
import os.path as osp
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import REPO_ROOT, free_port
from polaformerpp.engine import (
    CheckpointSaveError,
    ResumeMismatchError,
    checkpoint_fingerprint,
    decide_resume,
    elastic_restart_count,
)
from polaformerpp.engine.job_resume import check_same_checkpoint, decide_for_job
from polaformerpp.utils import DEFAULT_DIST_TIMEOUT, RunStoppedError, apply_dist_timeout, run_tool_main
from polaformerpp.utils.peers import PeerWatch, explain_collective_failure, heartbeat_period, is_collective_failure

HERE = osp.dirname(osp.abspath(__file__))
DEMO_CONFIG = osp.join(REPO_ROOT, 'configs', 'classification', 'polapp-b0_1xb32-30e_demo-shapes.py')
EPOCHS = 2  # 64 images, 8 per rank and batch, 2 ranks: 4 iterations an epoch

#: the tiny classifier of the fault runs (validation at the end gathers results through files)
FAULT_CONFIG = """
_base_ = [{base!r}]
custom_imports = dict(imports=['polaformerpp', 'polaformerpp.engine', 'fault_hooks'], allow_failed_imports=False)
size = 32
tiny = dict(_delete_=True, embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 4],
            cls_proj_channels=128, layer_scale_init_values=[1, 1, 1, 1])
model = dict(backbone=dict(arch=tiny, drop_path_rate=0.1), head=dict(in_channels=128))
train_dataloader = dict(
    batch_size=8, num_workers=0,
    dataset=dict(data_root={root!r}, indices=64, pipeline=[
        dict(type='LoadImageFromFile'),
        dict(type='RandomResizedCrop', scale=size, crop_ratio_range=(0.6, 1.0), backend='pillow'),
        dict(type='RandomFlip', prob=0.5, direction='horizontal'),
        dict(type='PackInputs'),
    ]))
val_dataloader = dict(
    batch_size=8, num_workers=0,
    dataset=dict(data_root={root!r}, pipeline=[
        dict(type='LoadImageFromFile'),
        dict(type='ResizeEdge', scale=size, edge='short', backend='pillow'),
        dict(type='CenterCrop', crop_size=size),
        dict(type='PackInputs'),
    ]))
test_dataloader = val_dataloader
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=True, begin=0, end=1, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=1, end={epochs}, T_max={epochs} - 1,
         convert_to_iter_based=True),
]
train_cfg = dict(max_epochs={epochs}, val_interval={epochs})
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1, max_keep_ckpts=5, save_best=None))
custom_hooks = {hooks}
randomness = dict(seed=0, deterministic=True)
"""


def write_config(folder, demo_root, hooks=()):
    """The fault-run config in ``folder`` (with ``hooks`` as its custom_hooks); returns its path."""
    os.makedirs(folder, exist_ok=True)
    path = osp.join(folder, 'fault_run.py')
    with open(path, 'w') as f:
        f.write(FAULT_CONFIG.format(base=DEMO_CONFIG, root=demo_root, epochs=EPOCHS, hooks=list(hooks)))
    return path


def launch_env(**extra):
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS='1',
               PYTHONPATH=os.pathsep.join(p for p in (HERE, os.environ.get('PYTHONPATH')) if p))
    for name in ('TORCHELASTIC_RESTART_COUNT', 'TORCHELASTIC_MAX_RESTARTS', 'WAIT_TO_BE_KILLED_MARKER',
                 'FREEZE_MARKER', 'POLAPP_DIST_TIMEOUT'):
        env.pop(name, None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def start_node(config, work_dir, cwd, log_path, env):
    """One torchrun agent of ``tools/dist_train.sh CONFIG 1`` (its own session), output to ``log_path``."""
    log = open(log_path, 'w')
    try:
        return subprocess.Popen(['bash', osp.join(REPO_ROOT, 'tools', 'dist_train.sh'), config, '1',
                                 '--work-dir', work_dir], cwd=cwd, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        log.close()


def wait_all(procs, timeout, logs):
    """Wait for every process; kill all trees and fail (with the logs' tails) after ``timeout`` s."""
    from test_elastic_restart import kill_tree
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail(f'the job did not finish in {timeout} s\n' + tails(logs))
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_tree(proc.pid)
                proc.wait()
    return [proc.returncode for proc in procs]


def tails(logs, chars=5000):
    out = []
    for path in logs:
        text = open(path).read() if osp.exists(path) else '(no log)'
        lines = [line for line in text.splitlines() if 'paramwise_options' not in line]
        out.append(f'--- {osp.basename(path)} ---\n' + '\n'.join(lines)[-chars:])
    return '\n'.join(out)


def wait_for(path, procs, timeout, logs):
    deadline = time.monotonic() + timeout
    while not osp.exists(path):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            wait_all(procs, 1, logs)
            pytest.fail(f'{path} was not written in {timeout} s\n' + tails(logs))
        time.sleep(0.2)


def wait_for_port(port, procs, timeout, logs):
    """Wait until something listens on 127.0.0.1:``port`` (a torchrun agent's rendezvous store)."""
    import socket
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as s:
            if s.connect_ex(('127.0.0.1', port)) == 0:
                return
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            wait_all(procs, 1, logs)
            pytest.fail(f'no rendezvous store on port {port} after {timeout} s\n' + tails(logs))
        time.sleep(0.1)


def two_node_job(config, root, node_env=None, port=None):
    """Start ``config`` as a two-node job in ``root``: two agents, the second once the first hosts the
    rendezvous; returns (work dir, [log paths], [processes], environment). ``node_env``: extra
    variables of the second node."""
    work_dir = osp.join(root, 'work')
    port = port or free_port()
    logs = [osp.join(root, 'node_a.log'), osp.join(root, 'node_b.log')]
    env = launch_env(NNODES=2, PORT=port, MAX_RESTARTS=2, POLAPP_DIST_TIMEOUT=60)
    procs = [start_node(config, work_dir, root, logs[0], env)]
    # node a comes first: it hosts the rendezvous store (and so survives the loss of node b)
    wait_for_port(port, procs, 120, logs)
    procs.append(start_node(config, work_dir, root, logs[1], dict(env, **(node_env or {}))))
    return work_dir, logs, procs, env


@pytest.fixture(scope='module')
def uninterrupted_two_node_run(demo_in1k, tmp_path_factory):
    """The reference: the fault config trained by two nodes without a fault (work dir, logs)."""
    root = str(tmp_path_factory.mktemp('two_node_reference'))
    config = write_config(root, demo_in1k)
    work_dir, logs, procs, _ = two_node_job(config, root)
    started = time.monotonic()
    codes = wait_all(procs, 300, logs)
    assert codes == [0, 0], tails(logs)
    print(f'uninterrupted two-node run: {time.monotonic() - started:.1f} s')
    return work_dir, logs


# ---------------------------------------------------------------------- slow: real processes
@pytest.mark.slow
def test_node_killed_and_replaced_ends_bit_identical(demo_in1k, tmp_path, uninterrupted_two_node_run):
    from test_elastic_restart import kill_tree, process_tree
    from test_exact_resume import compare_runs
    ref_dir, _ = uninterrupted_two_node_run
    root = str(tmp_path)
    config = write_config(root, demo_in1k, [dict(type='WaitToBeKilledHook', at_iter=6)])
    marker = osp.join(root, 'waiting.txt')
    started = time.monotonic()
    work_dir, logs, procs, env = two_node_job(config, root, node_env=dict(WAIT_TO_BE_KILLED_MARKER=marker))
    # node b's worker waits before iteration 6 (0-based; epoch 2, epoch_1.pth written): kill node b whole
    wait_for(marker, procs, 240, logs)
    lost_rank, lost_pid = map(int, open(marker).read().split())
    assert lost_pid in process_tree(procs[1].pid)
    kill_tree(procs[1].pid)
    procs[1].wait()
    time.sleep(1)
    logs.append(osp.join(root, 'node_b_replacement.log'))
    procs[1] = start_node(config, work_dir, root, logs[2], env)  # the replacement: a new agent, restart count 0
    codes = wait_all(procs, 300, logs)
    print(f'two-node run with node b killed and replaced: {time.monotonic() - started:.1f} s')
    assert codes == [0, 0], tails(logs)

    survivor, replacement = open(logs[0]).read(), open(logs[2]).read()
    print('\n'.join(line for line in survivor.splitlines() if 'lost peer' in line or 'ranks resumed' in line))
    # the survivor said which rank it lost (our line, and in torchrun's summary as that rank's error)
    if lost_rank == 0:  # node b got node rank 0 and hosted the group's store
        assert re.search(r"lost peer: the job's store at \S+ does not answer", survivor), tails(logs)
    else:
        assert re.search(rf'lost peer: rank {lost_rank} \(host \S+, pid {lost_pid}, last heartbeat at .*\) stopped '
                         r'answering \(no heartbeat in [\d.]+ s', survivor), tails(logs)
    # rank 0 (on the restarted agent, restart 1, or on the replacement, restart 0) decided to resume, and
    # both ranks resumed from epoch_1.pth
    assert re.search(r"this agent's restart [01]\): resuming from the latest checkpoint", survivor + replacement), \
        tails(logs)
    assert re.search(r'all 2 ranks resumed from \S+epoch_1\.pth \(\w+, \d+ bytes\) at iteration 4',
                     survivor + replacement), tails(logs)
    # DDP found every gradient in its parameter's layout
    assert 'Grad strides do not match bucket view strides' not in survivor + replacement
    report = compare_runs(ref_dir, work_dir, f'epoch_{EPOCHS}.pth')
    assert not report, '\n'.join(report)
    # distributed validation gathered its results under the work dir and left nothing behind
    assert not osp.exists(osp.join(root, '.dist_test'))
    leftovers = [osp.join(d, n) for d, dirs, _ in os.walk(work_dir) for n in dirs if n.startswith('.collect')]
    assert not leftovers, leftovers


@pytest.mark.slow
def test_frozen_peer_ends_the_job_within_the_timeout_naming_it(demo_in1k, tmp_path):
    from test_elastic_restart import kill_tree
    timeout = 8
    root = str(tmp_path)
    config = write_config(root, demo_in1k, [dict(type='FreezeHook', rank=1, at_iter=3)])
    marker = osp.join(root, 'frozen.txt')
    env = launch_env(PORT=free_port(), MAX_RESTARTS=0, POLAPP_DIST_TIMEOUT=timeout, FREEZE_MARKER=marker)
    proc = subprocess.Popen(['bash', osp.join(REPO_ROOT, 'tools', 'dist_train.sh'), config, '2', '--work-dir',
                             osp.join(root, 'work')], cwd=root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines, frozen_at, message_at, frozen_pid = [], None, None, None
    try:
        for line in proc.stdout:
            lines.append(line)
            if frozen_at is None and osp.exists(marker):
                frozen_at = osp.getmtime(marker)
                frozen_pid = int(open(marker).read().split()[1])
            if 'train.py: error: lost peer' in line and message_at is None:
                message_at = time.time()
                os.kill(frozen_pid, signal.SIGKILL)  # torchrun would wait 30 s for the frozen process
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()
    log = ''.join(lines)
    assert message_at is not None and frozen_at is not None, log[-6000:]
    print(f'frozen peer: the job reported it {message_at - frozen_at:.1f} s after it froze '
          f'(collective timeout {timeout} s)')
    assert message_at - frozen_at < timeout + 20, log[-6000:]
    assert proc.returncode != 0
    pattern = (rf'train.py: error: lost peer: rank 1 \(host \S+, pid {frozen_pid}, last heartbeat at .*\) '
               r'stopped answering \(no heartbeat in [\d.]+ s: the process is frozen or gone, or its node is '
               r'lost\); rank 0 \(host \S+\) stopped at before_train_iter \(iteration 3\) when its collective '
               r'failed: RuntimeError: (.*gloo.* Timed out waiting 8000ms|Application timeout caused pair closure)')
    assert re.search(pattern, log), log[-6000:]
    print(next(line for line in lines if line.startswith('train.py: error: lost peer')).strip())
    # torchrun's failure summary carries the same line as the surviving rank's error
    summary = log[log.rfind('Root Cause'):]
    assert re.search(r'traceback : train.py: error: lost peer: rank 1', summary), summary


def _mount_tmpfs(folder, size):
    os.makedirs(folder, exist_ok=True)
    if shutil.which('mount') is None or os.geteuid() != 0:
        pytest.skip('a full disk needs a small tmpfs, mounted as root (mount -t tmpfs): not root here')
    proc = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', folder],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f'mounting a tmpfs is not permitted here: {proc.stderr.strip()}')


@pytest.mark.slow
def test_full_disk_stops_the_run_naming_the_checkpoint_and_free_space(demo_in1k, tmp_path):
    disk = str(tmp_path / 'small_disk')
    _mount_tmpfs(disk, '192k')  # the logs fit, a checkpoint (about 0.9 MiB) does not
    try:
        config = write_config(str(tmp_path), demo_in1k)
        work_dir = osp.join(disk, 'work')
        proc = subprocess.run(
            [sys.executable, osp.join(REPO_ROOT, 'tools', 'train.py'), config, '--work-dir', work_dir,
             '--cfg-options', 'train_cfg.max_epochs=1', 'train_dataloader.dataset.indices=16'],
            cwd=str(tmp_path), env=launch_env(), capture_output=True, text=True, timeout=300)
        print('full disk:', proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else '(no stderr)')
        assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
        pattern = (rf'train.py: error: could not write the checkpoint {re.escape(work_dir)}/epoch_1.pth: '
                   r'\[Errno 28\] No space left on device; its folder '
                   rf'{re.escape(work_dir)} has [\d.]+ (B|KiB) free of 192.0 KiB')
        assert re.search(pattern, proc.stderr), proc.stderr[-3000:]
        assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
        # the same line is in the run's log file, and no partial checkpoint is left
        log_files = [osp.join(d, n) for d, _, names in os.walk(work_dir) for n in names if n.endswith('.log')]
        assert any(re.search(pattern, open(p).read()) for p in log_files), log_files
        assert not [n for n in os.listdir(work_dir) if n.endswith('.pth') or '.tmp-' in n], os.listdir(work_dir)
    finally:
        subprocess.run(['umount', disk], check=False)


SAME_CHECKPOINT_SCRIPT = """
import os, sys
import torch.distributed as dist
from polaformerpp.engine.job_resume import check_same_checkpoint
rank = int(os.environ['RANK'])
os.chdir(sys.argv[1 + rank])
dist.init_process_group('gloo', rank=rank, world_size=2)
try:
    check_same_checkpoint(os.path.join('work', 'epoch_1.pth'))
    print('same', flush=True)
except Exception as error:
    print(type(error).__name__, error, flush=True)
finally:  # a process group left to the interpreter's exit can abort there (std::terminate)
    dist.destroy_process_group()
"""


@pytest.mark.slow
def test_ranks_refuse_a_checkpoint_they_do_not_all_see(tmp_path):
    # two "nodes" whose work dirs are not shared: the same relative path, seen from two folders
    nodes = [str(tmp_path / 'node0'), str(tmp_path / 'node1')]
    for node in nodes:
        os.makedirs(osp.join(node, 'work'))
    torch.save(dict(w=torch.ones(3)), osp.join(nodes[0], 'work', 'epoch_1.pth'))

    def run_two_ranks():
        env = launch_env(MASTER_ADDR='127.0.0.1', MASTER_PORT=free_port(), WORLD_SIZE=2)
        procs = [subprocess.Popen([sys.executable, '-c', SAME_CHECKPOINT_SCRIPT, *nodes], env=dict(env, RANK=str(r)),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
        return [p.communicate(timeout=120)[0].strip().splitlines()[-1] for p in procs]

    outs = run_two_ranks()  # rank 1 has no such file: both ranks stop, naming rank 1
    for out in outs:
        assert out.startswith('ResumeMismatchError the job resumes from work/epoch_1.pth, which 1 of 2 ranks '
                              'cannot read (rank 1 (host '), outs
        assert 'The work dir is probably not shared between the nodes' in out, outs
    torch.save(dict(w=torch.zeros(3)), osp.join(nodes[1], 'work', 'epoch_1.pth'))
    outs = run_two_ranks()  # rank 1 has a file of its own under that name
    assert all(o.startswith('ResumeMismatchError the ranks see different files at work/epoch_1.pth') for o in outs)
    shutil.copy(osp.join(nodes[0], 'work', 'epoch_1.pth'), osp.join(nodes[1], 'work', 'epoch_1.pth'))
    assert run_two_ranks() == ['same', 'same']


# ---------------------------------------------------------------------- fast
def _checkpoint(path, value=1.0):
    torch.save(dict(meta=dict(iter=1), state_dict=dict(w=torch.full((8, ), value))), path)


def test_one_resume_rule_for_restarted_replacement_and_fresh_processes(tmp_path):
    work = str(tmp_path)
    elastic = {'TORCHELASTIC_MAX_RESTARTS': '3', 'TORCHELASTIC_RESTART_COUNT': '0'}
    # nothing saved yet: start as configured, or as --resume PATH says
    assert decide_resume(False, None, work, elastic).mode == 'configured'
    assert decide_resume(False, 'pretrained.pth', work, elastic).mode == 'configured'
    assert decide_resume(True, 'old/epoch_3.pth', work, elastic)[:2] == ('resume', 'old/epoch_3.pth')
    _checkpoint(osp.join(work, 'epoch_1.pth'))
    # a replacement node (restart 0) decides as a restarted one (restart 1): the work dir's checkpoint
    for count in ('0', '1'):
        decision = decide_resume(False, None, work, dict(elastic, TORCHELASTIC_RESTART_COUNT=count))
        assert decision.mode == 'scan' and f"restart {count}): resuming from the latest" in decision.reason
    decision = decide_resume(True, 'old/epoch_3.pth', work, elastic)
    assert decision.mode == 'scan' and decision.reason.endswith('instead of old/epoch_3.pth')
    # without restarts only --resume resumes
    assert decide_resume(False, None, work, {}).mode == 'configured'
    assert decide_resume(False, None, work, {'TORCHELASTIC_MAX_RESTARTS': '0'}).mode == 'configured'
    assert decide_resume(True, None, work, {}).mode == 'scan'
    with pytest.raises(ValueError, match='TORCHELASTIC_MAX_RESTARTS: expected an integer'):
        decide_resume(False, None, work, {'TORCHELASTIC_MAX_RESTARTS': 'many'})
    assert elastic_restart_count({'TORCHELASTIC_RESTART_COUNT': '2'}) == 2
    # one process: rank 0's decision, resolved to the newest complete checkpoint
    open(osp.join(work, '.epoch_2.pth.tmp-123'), 'w').close()
    decision = decide_for_job(lambda: decide_resume(False, None, work, elastic), work)
    assert decision[:2] == ('resume', osp.join(work, 'epoch_1.pth'))
    assert 'removed' in decision.reason and not osp.exists(osp.join(work, '.epoch_2.pth.tmp-123'))


def test_checkpoint_fingerprint_and_a_missing_file(tmp_path):
    a, b, c = (str(tmp_path / n) for n in ('a.pth', 'b.pth', 'c.pth'))
    _checkpoint(a), _checkpoint(c, value=2.0)
    shutil.copy(a, b)  # a copy under another name: the same content
    assert checkpoint_fingerprint(a) == checkpoint_fingerprint(b) != checkpoint_fingerprint(c)
    assert check_same_checkpoint(a) == checkpoint_fingerprint(a)
    with pytest.raises(ResumeMismatchError, match=r'which 1 of 1 ranks cannot read \(rank 0 \(host .*'
                       r'FileNotFoundError.*not shared between the nodes'):
        check_same_checkpoint(str(tmp_path / 'missing.pth'))


def test_collective_timeout_setting():
    from mmengine.config import Config
    cfg = Config(dict(env_cfg=dict(dist_cfg=dict(backend='gloo'))))
    assert apply_dist_timeout(cfg, {}) == DEFAULT_DIST_TIMEOUT == 600
    assert cfg.env_cfg.dist_cfg.timeout == 600
    assert apply_dist_timeout(Config(dict()), {'POLAPP_DIST_TIMEOUT': '45'}) == 45
    # the config (or --cfg-options env_cfg.dist_cfg.timeout=N) comes before the variable
    assert apply_dist_timeout(Config(dict(env_cfg=dict(dist_cfg=dict(timeout=120)))),
                              {'POLAPP_DIST_TIMEOUT': '45'}) == 120
    with pytest.raises(ValueError, match="POLAPP_DIST_TIMEOUT: .* positive number of seconds, got '0'"):
        apply_dist_timeout(Config(dict()), {'POLAPP_DIST_TIMEOUT': '0'})
    with pytest.raises(ValueError, match='env_cfg.dist_cfg.timeout: .* got .ten'):
        apply_dist_timeout(Config(dict(env_cfg=dict(dist_cfg=dict(timeout='ten')))), {})
    assert heartbeat_period(600) == 5 and heartbeat_period(8) == 0.5


def test_heartbeats_name_the_rank_that_stopped_answering():
    from datetime import timedelta

    import torch.distributed as dist
    port = free_port()
    server = dist.TCPStore('127.0.0.1', port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))

    def client():
        return dist.TCPStore('127.0.0.1', port, is_master=False, timeout=timedelta(seconds=5))

    watches = [PeerWatch(client(), 'job', rank, 3, 0.05, f'127.0.0.1:{port}').start() for rank in range(3)]
    try:
        for watch in watches:
            watch.stage = 'before_train_iter (iteration 6)'
        timeout = RuntimeError('[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 8000ms for recv')
        assert watches[0].explain(timeout) is None  # every rank answers at the same point
        watches[2].stage = 'before_val_iter (iteration 8)'
        assert re.match(r'ranks out of step: every rank answers, but rank 1 at before_train_iter \(iteration 6\), '
                        r'rank 2 at before_val_iter', watches[0].explain(timeout))
        watches[1].stop()  # frozen: no more heartbeats
        message = watches[0].explain(timeout)
        assert re.match(rf'lost peer: rank 1 \(host \S+, pid {os.getpid()}, last heartbeat at before_train_iter '
                        r'\(iteration 6\)\) stopped answering \(no heartbeat in 0.1 s', message), message
        assert message.endswith('rank 0 (host %s) stopped at before_train_iter (iteration 6) when its collective '
                                'failed: RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:81] Timed out '
                                'waiting 8000ms for recv' % watches[0].host)
        # gloo's other wording of a timed-out wait (DDP's buffer broadcast) is a failed collective too
        pair_closure = RuntimeError('Application timeout caused pair closure')
        assert is_collective_failure(timeout) and is_collective_failure(pair_closure)
        assert not is_collective_failure(ValueError('bad config'))
        # an error that is no failed collective is left alone; so is any error without a watch
        assert explain_collective_failure(ValueError('bad config')) is None
    finally:
        for watch in watches:
            watch.stop()
        del server


def test_run_stopped_error_ends_the_tool_with_one_line(tmp_path, monkeypatch, capsys):
    error_file = tmp_path / 'error.json'
    monkeypatch.setenv('TORCHELASTIC_ERROR_FILE', str(error_file))
    monkeypatch.setattr(sys, 'argv', ['train.py'])

    def main(argv):
        raise CheckpointSaveError('could not write the checkpoint w/epoch_2.pth: [Errno 28] No space left')

    with pytest.raises(SystemExit) as stop:
        run_tool_main(main)
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert err == 'train.py: error: could not write the checkpoint w/epoch_2.pth: [Errno 28] No space left\n'
    # what torchrun prints as this rank's traceback in its failure summary
    recorded = json.loads(error_file.read_text())['message']
    assert recorded['extraInfo']['py_callstack'] == err.strip() and issubclass(CheckpointSaveError, RunStoppedError)


def test_results_gathered_through_files_go_under_the_work_dir(tmp_path):
    from mmengine.evaluator import BaseMetric, Evaluator

    from test_exact_resume import _toy_runner

    class Count(BaseMetric):
        def process(self, data_batch, data_samples):
            self.results.append(len(data_samples))

        def compute_metrics(self, results):
            return dict(count=sum(results))

    runner = _toy_runner(tmp_path)
    own = Count(collect_dir=str(tmp_path / 'mine'))
    evaluator = runner.build_evaluator(Evaluator([Count(), own, Count(collect_device='gpu')]))
    dirs = [m.collect_dir for m in evaluator.metrics]
    assert dirs == [osp.join(runner.log_dir, '.collect-0-Count'), str(tmp_path / 'mine'), None]
