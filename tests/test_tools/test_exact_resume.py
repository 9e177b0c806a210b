"""Exact resumption through ``tools/train.py``: a run SIGKILLed and resumed with ``--resume``
ends bit-identical to an uninterrupted run (weights, optimizer state, logged metrics).

The slow tests kill a run twice with a real ``kill -9`` (the ``sigkill_at_iter``
hook of this folder, loaded through the config's ``custom_imports``): once in
the middle of an epoch, between checkpoints, and once right after a checkpoint
was written. The fast tests cover atomic writes, the fallback past a truncated
latest checkpoint and the restart rule.
"""
import glob
import json
import os
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import REPO_ROOT
from polaformerpp.engine import (
    CheckpointSaveError,
    atomic_write_text,
    capture_rng_state,
    checkpoint_problem,
    find_resumable_checkpoint,
    preserved_rng_state,
    restore_rng_state,
)

HERE = osp.dirname(osp.abspath(__file__))
DEMO_CONFIG = osp.join(REPO_ROOT, 'configs', 'classification', 'polapp-b0_1xb32-30e_demo-shapes.py')
SR_X2_CONFIG = osp.join(REPO_ROOT, 'configs', 'super_resolution', 'polapp-srlight_x2_8xb16-500k_div2k-192.py')
#: log fields that measure the machine, not the training
UNTIMED = {'time', 'data_time', 'eta', 'memory'}

CLS_CONFIG = """
_base_ = [{base!r}]
custom_imports = dict(imports=['polaformerpp', 'polaformerpp.engine', 'sigkill_at_iter'],
                      allow_failed_imports=False)
size = 32
tiny = dict(_delete_=True, embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 4],
            cls_proj_channels=128, layer_scale_init_values=[1, 1, 1, 1])
# drop path on: the model draws from torch's generator every step
model = dict(backbone=dict(arch=tiny, drop_path_rate=0.1), head=dict(in_channels=128))
# 20 training images in batches of 4 (5 iterations an epoch) and 8 validation images: whether a
# resumed run is bit-identical does not depend on how much data an iteration sees
train_dataloader = dict(
    batch_size=4, num_workers={workers},
    dataset=dict(data_root={root!r}, indices=20, pipeline=[
        dict(type='LoadImageFromFile'),
        dict(type='RandomResizedCrop', scale=size, crop_ratio_range=(0.6, 1.0), backend='pillow'),
        dict(type='RandomFlip', prob=0.5, direction='horizontal'),
        dict(type='PackInputs'),
    ]))
val_dataloader = dict(
    batch_size=8, num_workers=0,
    dataset=dict(data_root={root!r}, indices=8, pipeline=[
        dict(type='LoadImageFromFile'),
        dict(type='ResizeEdge', scale=size, edge='short', backend='pillow'),
        dict(type='CenterCrop', crop_size=size),
        dict(type='PackInputs'),
    ]))
test_dataloader = val_dataloader
max_epochs = 3
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=True, begin=0, end=1, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=1, end=max_epochs,
         T_max=max_epochs - 1, convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=max_epochs, val_interval=1)
# checkpoints by iteration inside the epoch loop (5 iterations an epoch)
default_hooks = dict(logger=dict(interval=1),
                     checkpoint=dict(by_epoch=False, interval=2, max_keep_ckpts=20))
randomness = dict(seed=0, deterministic=True)
"""

SR_CONFIG = """
_base_ = [{base!r}]
custom_imports = dict(imports=['polaformerpp.restoration', 'polaformerpp.engine', 'sigkill_at_iter'],
                      allow_failed_imports=False)
model = dict(network=dict(embed_dims=12, depths=(1, ), num_heads=2, window_size=4))
train_pipeline = [
    dict(type='LoadPairedImages'),
    dict(type='PairedRandomCrop', lr_patch_size=8),
    dict(type='PairedFlipRot'),
    dict(type='PackSRInputs'),
]
train_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root={train_root!r}, gt_dir='HR', lr_dir='LR', pipeline=train_pipeline))
val_dataloader = dict(num_workers=0, dataset=dict(name='val', data_root={val_root!r}))
param_scheduler = [dict(type='MultiStepLR', by_epoch=False, milestones=[6], gamma=0.5)]
train_cfg = dict(max_iters=12, val_interval=6)
default_hooks = dict(logger=dict(interval=1),
                     checkpoint=dict(interval=3, max_keep_ckpts=20, save_best='PSNR', rule='greater'))
randomness = dict(seed=0, deterministic=True)
"""


# ---------------------------------------------------------------------- helpers
def train(config, work_dir, *options, resume=False, kill=None):
    """Run tools/train.py; ``kill=(iteration, 'before'|'after')`` SIGKILLs it there.

    Returns the process; a killed run must end with SIGKILL, others with 0.
    """
    if kill is not None:  # the same config plus the hook that kills
        killing = osp.join(osp.dirname(config), f'kill_{kill[1]}_{kill[0]}.py')
        with open(killing, 'w') as f:
            f.write(f'_base_ = [{config!r}]\ncustom_hooks = [dict(type="SigkillAtIterHook", '
                    f'at_iter={kill[0]}, stage={kill[1]!r})]\n')
        config = killing
    cmd = [sys.executable, 'tools/train.py', config, '--work-dir', work_dir]
    if resume:
        cmd.append('--resume')
    if options:
        cmd += ['--cfg-options', *options]
    env = dict(os.environ, OMP_NUM_THREADS='1',
               PYTHONPATH=os.pathsep.join(p for p in (HERE, os.environ.get('PYTHONPATH')) if p))
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    expected = -9 if kill is not None else 0
    if proc.returncode != expected:
        pytest.fail(f'{" ".join(cmd)} exited {proc.returncode}, expected {expected}\n--- stdout ---\n'
                    f'{proc.stdout[-5000:]}\n--- stderr ---\n{proc.stderr[-5000:]}')
    return proc


def read_records(work_dir):
    """All scalars.json records of all runs in ``work_dir``: {(kind, step): record}.

    A step logged twice (by a killed run and again by the run that resumed)
    must have logged the same values; a conflict is returned as well.
    """
    records, conflicts = {}, []
    last_train_step = None  # carried over runs: a run resumed at an epoch end validates first
    for path in sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))):
        with open(path) as f:
            for line in f:
                if not line.strip():
                    continue
                rec = {k: v for k, v in json.loads(line).items() if k not in UNTIMED}
                if 'loss' in rec:
                    key = last_train_step = ('train', rec['step'])
                else:  # validation logs its epoch as step (0 in iteration loops): key it by
                    key = ('val after', last_train_step)  # the training step it followed
                if key in records and records[key] != rec:
                    conflicts.append((key, records[key], rec))
                records[key] = rec
    return records, conflicts


def tensor_diffs(a, b, prefix=''):
    """Differences between two nested checkpoint structures: [(path, description)]."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
            return [(prefix, f'{type(a).__name__}{getattr(a, "shape", "")} vs '
                             f'{type(b).__name__}{getattr(b, "shape", "")}')]
        if torch.equal(a, b):
            return []
        delta = (a.double() - b.double()).abs().max().item() if a.is_floating_point() else 'n/a'
        return [(prefix, f'max |d| = {delta}')]
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [(prefix, f'keys differ: {sorted(map(str, set(a) ^ set(b)))[:5]}')]
        return [d for k in a for d in tensor_diffs(a[k], b[k], f'{prefix}/{k}')]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [(prefix, f'lengths {len(a)} vs {len(b)}')]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in tensor_diffs(x, y, f'{prefix}[{i}]')]
    return [] if a == b else [(prefix, f'{a!r} vs {b!r}')]


def compare_runs(reference_dir, resumed_dir, final_name):
    """Compare the final checkpoints and the logs of two work dirs; the report lines (empty: equal)."""
    ref = torch.load(osp.join(reference_dir, final_name), map_location='cpu', weights_only=False)
    res = torch.load(osp.join(resumed_dir, final_name), map_location='cpu', weights_only=False)
    report = []
    weights = tensor_diffs(ref['state_dict'], res['state_dict'], 'state_dict')
    worst = max((torch.max((ref['state_dict'][k].double() - res['state_dict'][k].double()).abs()).item()
                 for k in ref['state_dict'] if ref['state_dict'][k].is_floating_point()), default=0.0)
    report += [f'weights: {len(weights)} tensors differ, max |d| = {worst:.3g}'] if weights else []
    for key in ('optimizer', 'param_schedulers'):
        report += [f'{path}: {why}' for path, why in tensor_diffs(ref.get(key), res.get(key), key)[:10]]
    if 'resume_state' in ref['meta'] and 'resume_state' in res['meta']:
        rng = tensor_diffs(ref['meta']['resume_state']['rng'], res['meta']['resume_state']['rng'], 'rng')
        report += [f'{path}: {why}' for path, why in rng[:5]]
    ref_log, ref_conflicts = read_records(reference_dir)
    res_log, res_conflicts = read_records(resumed_dir)
    report += [f'log conflict at {key}: {a} vs {b}' for key, a, b in ref_conflicts + res_conflicts]
    if set(ref_log) != set(res_log):
        report.append(f'logged steps differ: {sorted(set(ref_log) ^ set(res_log), key=str)[:10]}')
    for key in sorted(set(ref_log) & set(res_log), key=str):
        if ref_log[key] != res_log[key]:
            report.append(f'log {key}: {ref_log[key]} vs {res_log[key]}')
    return report


def resumed_from(proc):
    log = proc.stdout + proc.stderr
    return [line.split('Auto resumed from the latest checkpoint')[-1].strip().rstrip('.')
            for line in log.splitlines() if 'Auto resumed from the latest checkpoint' in line]


# ---------------------------------------------------------------------- slow: kill -9 and resume
@pytest.mark.slow
def test_classification_kill_resume_bit_identical(demo_in1k, tmp_path):
    """Epoch loop, iteration checkpoints, 2 data workers: killed mid-epoch, then right after the
    checkpoint at the end of an epoch; the resumed run equals the uninterrupted one bit for bit."""
    config = tmp_path / 'cls_resume.py'
    config.write_text(CLS_CONFIG.format(base=DEMO_CONFIG, root=demo_in1k, workers=2))
    ref_dir, run_dir = str(tmp_path / 'reference'), str(tmp_path / 'interrupted')
    train(str(config), ref_dir)
    # 5 iterations an epoch, checkpoints after iterations 2, 4, 6, ...
    train(str(config), run_dir, kill=(6, 'before'))  # mid-epoch 2; latest: iter_6 (1 batch into it)
    proc = train(str(config), run_dir, resume=True, kill=(9, 'after'))  # iter_10 just written
    assert resumed_from(proc) and resumed_from(proc)[-1].endswith('iter_6.pth'), proc.stdout[-2000:]
    assert 'Resuming epoch 2 after its first 1 batches' in proc.stdout + proc.stderr
    proc = train(str(config), run_dir, resume=True)
    assert resumed_from(proc)[-1].endswith('iter_10.pth'), proc.stdout[-2000:]
    report = compare_runs(ref_dir, run_dir, 'iter_15.pth')
    print('classification kill/resume vs uninterrupted:', report or 'bit-identical')
    assert not report, '\n'.join(report)


def _write_sr_data(root):
    from polaformerpp.restoration import imresize
    from polaformerpp.restoration.transforms import write_rgb
    rng = np.random.default_rng(0)
    for i in range(6):
        base = rng.integers(0, 256, (6, 6, 3)).astype(np.float64)
        hr = np.clip(np.kron(base, np.ones((6, 6, 1))) + rng.normal(0, 8, (36, 36, 3)), 0, 255)
        hr = hr.astype(np.uint8)
        for path, img in ((f'{root}/train/HR/{i:02d}.png', hr),
                          (f'{root}/train/LR/{i:02d}x2.png', imresize(hr, 0.5))):
            os.makedirs(osp.dirname(path), exist_ok=True)
            write_rgb(path, img)
    for i in range(2):
        hr = rng.integers(0, 256, (20, 24, 3)).astype(np.uint8)
        os.makedirs(f'{root}/val/val/HR', exist_ok=True)
        write_rgb(f'{root}/val/val/HR/{i}.png', hr)


@pytest.mark.slow
def test_sr_iteration_loop_kill_resume_bit_identical(tmp_path):
    """Iteration loop (InfiniteSampler, validation every 6 iterations): the same two kills."""
    _write_sr_data(str(tmp_path / 'data'))
    config = tmp_path / 'sr_resume.py'
    config.write_text(SR_CONFIG.format(base=SR_X2_CONFIG, train_root=str(tmp_path / 'data' / 'train'),
                                       val_root=str(tmp_path / 'data' / 'val')))
    ref_dir, run_dir = str(tmp_path / 'reference'), str(tmp_path / 'interrupted')
    train(str(config), ref_dir)
    train(str(config), run_dir, kill=(4, 'before'))  # between the checkpoints iter_3 and iter_6
    proc = train(str(config), run_dir, resume=True, kill=(8, 'after'))  # iter_9 just written
    assert resumed_from(proc)[-1].endswith('iter_3.pth'), proc.stdout[-2000:]
    proc = train(str(config), run_dir, resume=True)
    assert resumed_from(proc)[-1].endswith('iter_9.pth'), proc.stdout[-2000:]
    report = compare_runs(ref_dir, run_dir, 'iter_12.pth')
    print('super-resolution kill/resume vs uninterrupted:', report or 'bit-identical')
    assert not report, '\n'.join(report)


# ---------------------------------------------------------------------- fast
def test_rng_state_round_trip_and_weights_only(tmp_path):
    import random
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    np.random.randn()  # a cached gaussian is part of numpy's state
    state = capture_rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(3))
    path = str(tmp_path / 'state.pth')
    torch.save(dict(resume_state=dict(rng=[state])), path)
    loaded = torch.load(path, weights_only=True)['resume_state']['rng'][0]  # plain types only
    random.random(), np.random.rand(), torch.rand(7)
    restore_rng_state(loaded)
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert again[:2] == expected[:2] and torch.equal(again[2], expected[2])
    with pytest.raises(KeyError, match="'numpy'"):
        restore_rng_state(dict(python=state['python'], torch=state['torch']))


def test_preserved_rng_state_leaves_streams_untouched():
    torch.manual_seed(3)
    reference = torch.rand(4)
    torch.manual_seed(3)
    with preserved_rng_state():
        torch.rand(100), np.random.rand(10)
    assert torch.equal(torch.rand(4), reference)


def _toy_runner(tmp_path, **kwargs):
    from mmengine.model import BaseModel

    from polaformerpp.engine import PolaRunner

    class Toy(BaseModel):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(2, 2)

        def forward(self, inputs=None, data_samples=None, mode='tensor'):
            return self.fc(inputs)

    return PolaRunner(model=Toy(), work_dir=str(tmp_path / 'work'),
                      train_dataloader=torch.utils.data.DataLoader([torch.zeros(2)] * 4, batch_size=2),
                      train_cfg=dict(by_epoch=True, max_epochs=1),
                      optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)), **kwargs)


def test_atomic_checkpoint_save_keeps_the_old_file_when_the_write_fails(tmp_path, monkeypatch):
    from mmengine.fileio import LocalBackend
    runner = _toy_runner(tmp_path)
    work = runner.work_dir
    runner.save_checkpoint(work, 'iter_1.pth', save_optimizer=False, save_param_scheduler=False)
    before = open(osp.join(work, 'iter_1.pth'), 'rb').read()

    original_put = LocalBackend.put

    def half_then_fail(self, obj, filepath):
        original_put(self, obj[:len(obj) // 2], filepath)  # a disk that fills up halfway
        raise OSError(28, 'No space left on device')

    monkeypatch.setattr(LocalBackend, 'put', half_then_fail)
    for name in ('iter_1.pth', 'iter_2.pth'):
        # the error names the file and the free space of its folder
        with pytest.raises(CheckpointSaveError, match=rf'{osp.join(work, name)}: \[Errno 28\] No space left on '
                           rf'device; its folder {work} has .* free of .*iter_1.pth, takes'):
            runner.save_checkpoint(work, name, save_optimizer=False, save_param_scheduler=False)
    assert open(osp.join(work, 'iter_1.pth'), 'rb').read() == before  # the old file, whole
    assert not osp.exists(osp.join(work, 'iter_2.pth'))
    leftovers = [n for n in os.listdir(work) if 'tmp' in n]
    assert not leftovers, leftovers
    assert checkpoint_problem(osp.join(work, 'iter_1.pth')) is None


def test_atomic_write_text_failure_leaves_previous_pointer(tmp_path, monkeypatch):
    pointer = str(tmp_path / 'last_checkpoint')
    atomic_write_text(pointer, 'work/iter_3.pth')

    def boom(*args):
        raise OSError('rename failed')

    monkeypatch.setattr(os, 'replace', boom)
    with pytest.raises(OSError, match='rename failed'):
        atomic_write_text(pointer, 'work/iter_6.pth')
    assert open(pointer).read() == 'work/iter_3.pth'
    assert os.listdir(tmp_path) == ['last_checkpoint']


def _checkpoint(path, step):
    torch.save(dict(meta=dict(iter=step), state_dict=dict(w=torch.full((64, 64), float(step)))), path)


def test_truncated_latest_checkpoint_is_skipped_for_the_previous_one(tmp_path, capsys):
    work = str(tmp_path)
    for step in (3, 6):
        _checkpoint(osp.join(work, f'iter_{step}.pth'), step)
        os.utime(osp.join(work, f'iter_{step}.pth'), (step, step))
    atomic_write_text(osp.join(work, 'last_checkpoint'), osp.join(work, 'iter_6.pth'))
    assert find_resumable_checkpoint(work) == (osp.join(work, 'iter_6.pth'), [])
    latest = osp.join(work, 'iter_6.pth')
    with open(latest, 'r+b') as f:  # a copy cut short
        f.truncate(os.path.getsize(latest) // 2)
    path, skipped = find_resumable_checkpoint(work)
    assert path == osp.join(work, 'iter_3.pth')
    assert [p for p, _ in skipped] == [latest] and 'truncated' in skipped[0][1]
    # an empty pointer (a write cut off by an older mmengine) falls back to the folder's files
    open(osp.join(work, 'last_checkpoint'), 'w').close()
    assert find_resumable_checkpoint(work)[0] == osp.join(work, 'iter_3.pth')
    # nothing readable at all: an error listing the files
    with open(osp.join(work, 'iter_3.pth'), 'r+b') as f:
        f.truncate(100)
    with pytest.raises(RuntimeError, match='iter_3.pth'):
        find_resumable_checkpoint(work)
    assert find_resumable_checkpoint(str(tmp_path / 'empty_dir')) == (None, [])


def test_pola_runner_swaps_loops_and_checkpoint_hook(tmp_path):
    from polaformerpp.engine import (
        AtomicCheckpointHook,
        ResumableEpochBasedTrainLoop,
        ResumableIterBasedTrainLoop,
    )
    runner = _toy_runner(tmp_path, default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=2)))
    hooks = [h for h in runner.hooks if isinstance(h, AtomicCheckpointHook)]
    assert len(hooks) == 1 and hooks[0].interval == 2
    assert isinstance(runner.build_train_loop(dict(by_epoch=True, max_epochs=1)), ResumableEpochBasedTrainLoop)
    assert isinstance(runner.build_train_loop(dict(type='IterBasedTrainLoop', max_iters=2)),
                      ResumableIterBasedTrainLoop)


@pytest.mark.parametrize('config', [
    'configs/classification/polapp-b0_1xb32-30e_demo-shapes.py',
    'configs/segmentation/polapp-b1_lightham_1xb8-1k_demo-ade20k-64x64.py',
    'configs/super_resolution/polapp-srlight_x2_8xb16-500k_div2k-192.py',
    'configs/generation/dit-tiny-4_polapp_1xb32-2k_demo-shapes-32.py',
    'configs/detection/retinanet_polapp-b2_fpn_8xb2-amp-1x_coco.py',
])
def test_shipped_configs_use_pola_runner(config):
    from mmengine.config import Config
    path = osp.join(REPO_ROOT, config)
    if not osp.isfile(path):
        pytest.skip(f'{config} is not in this checkout')
    from mmengine.registry import RUNNERS

    from polaformerpp.engine import PolaRunner
    cfg = Config.fromfile(path)
    assert RUNNERS.get(cfg.runner_type) is PolaRunner
