"""`slow`: a pixel-space DiT run through tools/train.py, sample.py (single process and
torchrun with 2 CPU processes) and fid.py, and tools/dist_train.sh with 2 CPU processes."""
import glob
import json
import os.path as osp

import numpy as np
import pytest
import torch

from conftest import call_tool, free_port, load_tool, run_tool
from generation_testing import PIXEL_CONFIG, make_shapes32, read_npz_like_adm
from polaformerpp.generation import ClassImageFolder, sample_generators


@pytest.fixture(scope='module')
def shapes32(tmp_path_factory):
    return make_shapes32(str(tmp_path_factory.mktemp('shapes32')))


def _scalars(work_dir):
    logs = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    assert logs, f'no scalars.json under {work_dir}'
    with open(logs[-1]) as f:
        return [json.loads(line) for line in f if line.strip()]


TINY_OPTIONS = ['model.dit.arch.hidden_size=64', 'model.dit.arch.depth=2', 'model.dit.arch.num_heads=2']


@pytest.mark.slow
def test_pixel_dit_end_to_end(shapes32, tmp_path):
    """tools/train.py (loss falls, FID validation) -> sample.py (1 process and torchrun x2) -> fid.py."""
    work_dir = str(tmp_path / 'work')
    iters = 100
    data = [f'{split}.dataset.data_root={shapes32}'
            for split in ('train_dataloader', 'val_dataloader', 'test_dataloader')]
    call_tool(['tools/train.py', PIXEL_CONFIG, '--work-dir', work_dir, '--cfg-options', *data,
               *TINY_OPTIONS, 'train_dataloader.batch_size=16', f'train_cfg.max_iters={iters}',
               f'train_cfg.val_interval={iters}', 'val_dataloader.batch_size=16',
               'optim_wrapper.optimizer.lr=2e-3', 'param_scheduler.0.end=10',
               'model.sample_cfg.num_steps=5', 'custom_hooks.0.momentum=0.1',
               'default_hooks.logger.interval=5', f'default_hooks.checkpoint.interval={iters}'])
    records = _scalars(work_dir)
    losses = [r['loss_mse'] for r in records if 'loss_mse' in r]
    assert np.mean(losses[-3:]) < 0.5 * np.mean(losses[:3]), losses
    fids = [r['gen/FID'] for r in records if 'gen/FID' in r]
    assert fids and all(np.isfinite(fids)), records[-1]
    ckpt = osp.join(work_dir, f'iter_{iters}.pth')
    assert osp.isfile(ckpt)

    common = ['--labels', '0', '1', '2', '3', '--num-samples', '8', '--steps', '5', '--sampler', 'ddim',
              '--seed', '3', '--batch-size', '3', '--cfg-options', *TINY_OPTIONS]
    single, dist = tmp_path / 'single', tmp_path / 'dist'
    call_tool(['tools/generation/sample.py', PIXEL_CONFIG, ckpt, '--out-dir', str(single), *common])
    run_tool(['-m', 'torch.distributed.run', '--nproc_per_node', '2', '--master_port', str(free_port()),
              'tools/generation/sample.py', PIXEL_CONFIG, ckpt, '--out-dir', str(dist),
              '--launcher', 'pytorch', *common], env=dict(OMP_NUM_THREADS='1'))
    a = np.load(single / 'samples_8x32x32x3.npz')
    b = np.load(dist / 'samples_8x32x32x3.npz')
    assert a['arr_0'].shape == (8, 32, 32, 3) and a['arr_0'].dtype == np.uint8
    assert a['arr_1'].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    # a fixed seed gives the same images, whatever the process count and batching
    assert np.abs(a['arr_0'].astype(int) - b['arr_0']).max() <= 1
    # exactly 8 gathered from the 2 processes, in sample order, streamed as ADM's evaluator reads it
    np.testing.assert_array_equal(read_npz_like_adm(dist / 'samples_8x32x32x3.npz'), b['arr_0'])
    assert osp.isfile(single / 'grid_000.png') and osp.isfile(dist / 'grid_000.png')

    # class-conditional: the same noise under another label gives another image
    sample = load_tool('tools/generation/sample.py')
    options = {key: int(value) for key, value in (o.split('=') for o in TINY_OPTIONS)}
    model = sample.build_model(PIXEL_CONFIG, ckpt, options)
    by_class = [model.sample(torch.full((4, ), c), num_steps=5, sampler='ddim', cfg_scale=3.0,
                             generator=sample_generators(3, range(4))).float() for c in range(2)]
    assert (by_class[0] - by_class[1]).abs().mean() > 1.0

    real = tmp_path / 'real.npz'
    val = ClassImageFolder(shapes32, 'val', 'meta/val.txt', image_size=32, test_mode=True)
    np.savez(real, arr_0=np.stack([val[i]['inputs'].permute(1, 2, 0).numpy() for i in range(len(val))]))
    out_json = tmp_path / 'fid.json'
    call_tool(['tools/generation/fid.py', str(single / 'samples_8x32x32x3.npz'), str(real),
               '--extractor', 'random-conv', '--out-json', str(out_json)])
    result = json.loads(out_json.read_text())
    assert np.isfinite(result['FID']) and result['FID'] > 0 and np.isfinite(result['IS'])


@pytest.mark.slow
def test_dist_train_two_cpu_processes(shapes32, tmp_path):
    """tools/dist_train.sh: DDP over gloo with 2 CPU processes, FID validation gathered across ranks."""
    work_dir = str(tmp_path / 'dist')
    data = [f'{split}.dataset.data_root={shapes32}'
            for split in ('train_dataloader', 'val_dataloader', 'test_dataloader')]
    proc = run_tool(['tools/dist_train.sh', PIXEL_CONFIG, '2', '--work-dir', work_dir, '--cfg-options',
                     *data, *TINY_OPTIONS, 'train_dataloader.batch_size=8', 'train_cfg.max_iters=4',
                     'train_cfg.val_interval=4', 'val_dataloader.batch_size=4',
                     'val_dataloader.dataset.indices=8', 'model.sample_cfg.num_steps=2',
                     'default_hooks.logger.interval=2', 'default_hooks.checkpoint.interval=4'],
                    env=dict(PORT=str(free_port()), OMP_NUM_THREADS='1'))
    log = proc.stdout + proc.stderr
    assert 'Distributed training: True' in log and 'GPU number: 2' in log, log[-3000:]
    assert osp.isfile(osp.join(work_dir, 'iter_4.pth'))
    assert any(np.isfinite(r.get('gen/FID', np.nan)) for r in _scalars(work_dir))
