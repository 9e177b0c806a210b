"""End to end (``-m slow``): short Mask R-CNN and RetinaNet runs through
``tools/train.py`` on the generated COCO-format shapes set with a tiny arch,
evaluation through ``tools/test.py`` with mmdet's ``CocoMetric``, a run through
``tools/dist_train.sh`` with 2 CPU processes, broken annotations through the
train tool, and ``get_flops.py`` at 1280x800."""
import glob
import json
import math
import os
import os.path as osp
import shutil
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, call_tool, free_port, run_tool
from detection_testing import (  # noqa: F401 (fixtures)
    CLASSES,
    CLS_DEMO_CONFIG,
    MASK_RCNN_B2,
    RETINANET_B2,
    TINY,
    broken_copy,
    demo_coco,
    one_thread,
    set_category,
)

# TINY as config source, replacing the base config's arch name
TINY_SRC = 'dict(_delete_=True, ' + ', '.join(f'{k}={v!r}' for k, v in TINY.items()) + ')'


def read_scalars(work_dir):
    logs = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    assert logs, f'no scalars.json under {work_dir}'
    with open(logs[-1]) as f:
        return [json.loads(line) for line in f if line.strip()]


def run(args, **kwargs):
    """``run_tool`` with one OpenMP thread per process (see ``one_thread``): for the launchers."""
    env = dict(OMP_NUM_THREADS='1', **kwargs.pop('env', {}))
    return run_tool(args, env=env, **kwargs)


def write_tiny_config(path, base, data_root, epochs, init_checkpoint=None, lr=2e-3):
    """A test config inheriting ``base``: tiny arch and heads, small images, short schedule."""
    is_mask = 'mask-rcnn' in base
    init_cfg = None if init_checkpoint is None else dict(
        type='Pretrained', checkpoint=init_checkpoint, prefix='backbone.')
    if is_mask:
        model = f"""
model = dict(
    backbone=dict(arch={TINY_SRC}, drop_path_rate=0.0, init_cfg={init_cfg!r}),
    neck=dict(in_channels={TINY['embed_dims']!r}, out_channels=32),
    rpn_head=dict(in_channels=32, feat_channels=32),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=32),
        bbox_head=dict(in_channels=32, fc_out_channels=64, num_classes={len(CLASSES)}),
        mask_roi_extractor=dict(out_channels=32),
        mask_head=dict(num_convs=1, in_channels=32, conv_out_channels=32,
                       num_classes={len(CLASSES)})),
    train_cfg=dict(rpn_proposal=dict(nms_pre=500, max_per_img=200),
                   rcnn=dict(sampler=dict(num=128))),
    test_cfg=dict(rpn=dict(nms_pre=300, max_per_img=100)))
"""
    else:
        model = f"""
model = dict(
    backbone=dict(arch={TINY_SRC}, drop_path_rate=0.0, init_cfg={init_cfg!r}),
    neck=dict(in_channels={TINY['embed_dims'][1:]!r}, out_channels=32),
    bbox_head=dict(in_channels=32, feat_channels=32, stacked_convs=2, num_classes={len(CLASSES)}))
"""
    load = "dict(type='LoadAnnotations', with_bbox=True" + (', with_mask=True)' if is_mask else ')')
    text = f"""_base_ = [{osp.join(REPO_ROOT, base)!r}]
{model}
data_root = {data_root.rstrip('/') + '/'!r}
metainfo = dict(classes={CLASSES!r})
train_pipeline = [
    dict(type='LoadImageFromFile'),
    {load},
    dict(type='Resize', scale=(256, 160), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(256, 160), keep_ratio=True),
    {load},
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=4, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, ann_file='annotations/instances_train.json',
                 data_prefix=dict(img='train/'), metainfo=metainfo, pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=4, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, ann_file='annotations/instances_val.json',
                 data_prefix=dict(img='val/'), metainfo=metainfo, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator

max_epochs = {epochs}
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
optim_wrapper = dict(optimizer=dict(lr={lr}))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=10),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True,
         milestones=[max_epochs - 2], gamma=0.1),
]
auto_scale_lr = dict(base_batch_size=4)
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=max_epochs),
                     visualization=dict(type='DetVisualizationHook', draw=False))
log_processor = dict(window_size=1)
randomness = dict(seed=0)
"""
    with open(path, 'w') as f:
        f.write(text)
    return str(path)


def check_train_and_test(tmp_path, config, work_dir, epochs, metrics, learned):
    """Loss went down; tools/test.py gives finite COCO metrics, and ``learned`` ones above 0.3."""
    records = [r for r in read_scalars(work_dir) if 'loss' in r]
    assert len(records) >= 20
    first = sum(r['loss'] for r in records[:5]) / 5
    last = sum(r['loss'] for r in records[-5:]) / 5
    print(f'{osp.basename(config)}: loss {first:.3f} -> {last:.3f} (ratio {last / first:.3f})')
    assert last < 0.75 * first, (first, last)
    ckpt = osp.join(work_dir, f'epoch_{epochs}.pth')
    assert osp.isfile(ckpt)
    out = str(tmp_path / 'metrics.json')
    call_tool(['tools/test.py', config, ckpt, '--work-dir', work_dir, '--out-json', out])
    with open(out) as f:
        results = json.load(f)
    print(f'{osp.basename(config)}:', {key: results[key] for key in metrics if key in results})
    for key in metrics:
        assert key in results, results
        assert math.isfinite(results[key]) and 0.0 <= results[key] <= 1.0, results
    for key in learned:  # chance is ~0 for shapes at random places
        assert results[key] > 0.3, results
    return results


@pytest.mark.slow
def test_mask_rcnn_train_from_classification_checkpoint_and_evaluate(demo_coco, demo_in1k,
                                                                     tmp_path):
    # an ImageNet-style classifier of the tiny arch trained briefly by tools/train.py
    cls_dir = str(tmp_path / 'cls')
    cls_config = tmp_path / 'cls_tiny.py'
    cls_config.write_text(f"""_base_ = [{osp.join(REPO_ROOT, CLS_DEMO_CONFIG)!r}]
model = dict(backbone=dict(arch={TINY_SRC}))
train_dataloader = dict(num_workers=0, dataset=dict(data_root={demo_in1k!r}))
train_cfg = dict(max_epochs=1)
default_hooks = dict(checkpoint=dict(interval=1, save_best=None))
""")
    call_tool(['tools/train.py', str(cls_config), '--work-dir', cls_dir, '--no-validate'])
    cls_ckpt = osp.join(cls_dir, 'epoch_1.pth')
    assert osp.isfile(cls_ckpt)

    epochs = 6  # 2 seeds: bbox and segm mAP_50 >= 0.95, loss ratio <= 0.3 against the 0.3 and 0.75 asked
    config = write_tiny_config(tmp_path / 'mask_rcnn_tiny.py', MASK_RCNN_B2, demo_coco, epochs,
                               init_checkpoint=cls_ckpt)
    work_dir = str(tmp_path / 'work')
    proc = call_tool(['tools/train.py', config, '--work-dir', work_dir])
    log = proc.stdout + proc.stderr
    assert f'load backbone. in model from: {cls_ckpt}' in log, log[-4000:]
    assert 'missing keys in source state_dict: norm0.weight' in log, log[-4000:]
    assert 'unexpected key in source state_dict: cls_proj.conv.weight' in log, log[-4000:]
    check_train_and_test(tmp_path, config, work_dir, epochs,
                         ['coco/bbox_mAP', 'coco/bbox_mAP_50', 'coco/segm_mAP', 'coco/segm_mAP_50'],
                         learned=['coco/bbox_mAP_50', 'coco/segm_mAP_50'])


@pytest.mark.slow
def test_retinanet_train_and_evaluate(demo_coco, tmp_path):
    epochs = 8
    config = write_tiny_config(tmp_path / 'retinanet_tiny.py', RETINANET_B2, demo_coco, epochs)
    work_dir = str(tmp_path / 'work')
    call_tool(['tools/train.py', config, '--work-dir', work_dir])
    check_train_and_test(tmp_path, config, work_dir, epochs, ['coco/bbox_mAP', 'coco/bbox_mAP_50'],
                         learned=['coco/bbox_mAP_50'])


@pytest.mark.slow
def test_mask_rcnn_dist_train_two_cpu_processes(demo_coco, tmp_path):
    epochs = 2  # what is checked (2 processes, the iterations, distributed COCO evaluation) needs no more
    config = write_tiny_config(tmp_path / 'mask_rcnn_tiny.py', MASK_RCNN_B2, demo_coco, epochs)
    work_dir = str(tmp_path / 'dist')
    proc = run(['tools/dist_train.sh', config, '2', '--work-dir', work_dir,
                     '--cfg-options', 'train_dataloader.batch_size=2'],
                    env=dict(PORT=str(free_port())))
    log = proc.stdout + proc.stderr
    assert 'Distributed training: True' in log and 'GPU number: 2' in log, log[-3000:]
    assert 'AmpOptimWrapper (mixed precision) replaced by OptimWrapper' in log
    assert osp.isfile(osp.join(work_dir, f'epoch_{epochs}.pth'))
    records = read_scalars(work_dir)
    # 2 processes x 2 images: 8 iterations per epoch
    assert max(r.get('iter', 0) for r in records) == 8 * epochs, records[-2]
    assert any('coco/bbox_mAP' in r and 'coco/segm_mAP' in r for r in records), records[-1]


@pytest.mark.slow
def test_broken_annotations_through_train_tool(demo_coco, tmp_path):
    root = broken_copy(demo_coco, tmp_path, set_category)
    shutil.copytree(osp.join(demo_coco, 'val'), osp.join(root, 'val'))
    shutil.copy(osp.join(demo_coco, 'annotations', 'instances_val.json'),
                osp.join(root, 'annotations'))
    config = write_tiny_config(tmp_path / 'mask_rcnn_tiny.py', MASK_RCNN_B2, root, epochs=1)
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, 'tools/train.py', config, '--work-dir',
                           str(tmp_path / 'work')], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode != 0
    assert "CocoAnnotationError: CheckedCocoDataset: ann_file" in proc.stderr, proc.stderr[-3000:]
    assert "category_id 42" in proc.stderr


@pytest.mark.slow
def test_get_flops_of_detectors_at_1280x800():
    proc = call_tool(['tools/analysis_tools/get_flops.py', MASK_RCNN_B2])
    assert 'Input shape: (3, 800, 1280)' in proc.stdout, proc.stdout
    flops = float(proc.stdout.split('Flops: ')[1].split('G')[0])
    assert 100 < flops < 1000, proc.stdout
