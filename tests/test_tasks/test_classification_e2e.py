"""End to end through the tools: train, evaluate, resume, distributed (CPU/gloo).

Runs PolaFormer++-b0 (the demo config) on the generated ImageNet-format set.
"""
import glob
import json
import os.path as osp

import pytest

from conftest import call_tool, free_port, run_tool

DEMO_CONFIG = 'configs/classification/polapp-b0_1xb32-30e_demo-shapes.py'


def data_options(root, size=32):
    """Point the demo config at ``root``; train and test at ``size`` px to keep CPU runs short."""
    options = []
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        options += [f'{key}.dataset.data_root={root}', f'{key}.num_workers=0']
    options += [f'train_dataloader.dataset.pipeline.1.scale={size}']
    for key in ('val_dataloader', 'test_dataloader'):
        options += [f'{key}.dataset.pipeline.1.scale={size}',
                    f'{key}.dataset.pipeline.2.crop_size={size}']
    return options


def read_scalars(work_dir):
    """The training log records (``vis_data/scalars.json``) of the newest run in ``work_dir``."""
    logs = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    assert logs, f'no scalars.json under {work_dir}'
    with open(logs[-1]) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.mark.slow
def test_train_evaluate_and_resume(demo_in1k, tmp_path):
    work_dir = str(tmp_path / 'work')
    epochs = 8
    call_tool(['tools/train.py', DEMO_CONFIG, '--work-dir', work_dir, '--cfg-options',
               *data_options(demo_in1k), f'train_cfg.max_epochs={epochs}', 'train_cfg.val_interval=4',
               f'param_scheduler.1.end={epochs}', f'param_scheduler.1.T_max={epochs - 2}',
               'default_hooks.checkpoint.interval=4', 'default_hooks.checkpoint.max_keep_ckpts=2'])
    records = [r for r in read_scalars(work_dir) if 'loss' in r]
    first = sum(r['loss'] for r in records[:3]) / 3
    last = sum(r['loss'] for r in records[-3:]) / 3
    print(f'classification demo, {epochs} epochs: loss {first:.3f} -> {last:.3f} (ratio {last / first:.3f})')
    assert last < 0.7 * first, (first, last)

    ckpt = osp.join(work_dir, f'epoch_{epochs}.pth')
    assert osp.isfile(ckpt)
    metrics_file = str(tmp_path / 'metrics.json')
    call_tool(['tools/test.py', DEMO_CONFIG, ckpt, '--work-dir', work_dir, '--out-json', metrics_file,
               '--cfg-options', *data_options(demo_in1k)])
    with open(metrics_file) as f:
        top1 = json.load(f)['accuracy/top1']
    print(f'classification demo, {epochs} epochs: top-1 {top1:.1f}%')
    assert top1 >= 60.0, f'top-1 {top1}% vs 25% chance'

    # resume from the Runner's own checkpoint (message hub, optimizer, scheduler):
    # torch >= 2.6 loads weights_only by default, which the tools handle
    proc = call_tool(['tools/train.py', DEMO_CONFIG, '--work-dir', work_dir, '--resume', ckpt,
                      '--cfg-options', *data_options(demo_in1k), f'train_cfg.max_epochs={epochs + 1}',
                      f'param_scheduler.1.end={epochs + 1}', 'train_cfg.val_interval=100',
                      'default_hooks.checkpoint.interval=1'])
    log = proc.stdout + proc.stderr
    assert f'resumed epoch: {epochs},' in log, log[-3000:]
    assert osp.isfile(osp.join(work_dir, f'epoch_{epochs + 1}.pth'))


@pytest.mark.slow
def test_dist_train_two_cpu_processes(demo_in1k, tmp_path):
    work_dir = str(tmp_path / 'dist')
    proc = run_tool(['tools/dist_train.sh', DEMO_CONFIG, '2', '--work-dir', work_dir,
                     '--cfg-options', *data_options(demo_in1k), 'train_cfg.max_epochs=1',
                     'train_cfg.val_interval=1', 'train_dataloader.batch_size=16',
                     'default_hooks.checkpoint.interval=1'],
                    env=dict(PORT=str(free_port()), OMP_NUM_THREADS='1'))
    log = proc.stdout + proc.stderr
    assert 'Distributed training: True' in log and 'GPU number: 2' in log, log[-3000:]
    assert osp.isfile(osp.join(work_dir, 'epoch_1.pth'))
    records = read_scalars(work_dir)
    assert any('accuracy/top1' in r for r in records)

    metrics_file = str(tmp_path / 'dist_metrics.json')
    proc = run_tool(['tools/dist_test.sh', DEMO_CONFIG, osp.join(work_dir, 'epoch_1.pth'), '2',
                     '--work-dir', str(tmp_path / 'dist_test'), '--out-json', metrics_file,
                     '--cfg-options', *data_options(demo_in1k)],
                    env=dict(PORT=str(free_port()), OMP_NUM_THREADS='1'))
    assert 'GPU number: 2' in proc.stdout + proc.stderr
    with open(metrics_file) as f:
        assert 0.0 <= json.load(f)['accuracy/top1'] <= 100.0
