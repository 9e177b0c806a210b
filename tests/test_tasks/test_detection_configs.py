"""COCO detection and instance segmentation configs (mmdet 3.3): every config carries
the authors' recipe and evaluation protocol (read back from what mmengine builds),
builds (model, data pipeline) and runs a loss and a predict forward on small CPU
images, and its pipelines read COCO-format data."""
import copy
import glob
import os.path as osp

import pytest
import torch

from conftest import REPO_ROOT
from detection_testing import (  # noqa: F401 (fixtures)
    CLASSES,
    build_detector,
    demo_batch,
    demo_coco,
    load_cfg,
    one_thread,
    use_mmdet,
)
from recipe_testing import (
    authors_name,
    build_model,
    images_per_iteration,
    lr_at,
    norm_training_modes,
    optimizer_groups,
)

DET_DIR = osp.join(REPO_ROOT, 'configs', 'detection')
CONFIGS = sorted(glob.glob(osp.join(DET_DIR, '*.py')))
# the published configs: RetinaNet b2/b3, Mask R-CNN 1x b2-b5 and 3x b2-b4
PUBLISHED_CONFIGS = {
    *(f'retinanet_polapp-{a}_fpn_8xb2-amp-1x_coco.py' for a in ('b2', 'b3')),
    *(f'mask-rcnn_polapp-{a}_fpn_8xb2-amp-1x_coco.py' for a in ('b2', 'b3', 'b4', 'b5')),
    *(f'mask-rcnn_polapp-{a}_fpn_8xb2-amp-ms-crop-3x_coco.py' for a in ('b2', 'b3', 'b4')),
}
MASK_RCNN_B2 = osp.join(DET_DIR, 'mask-rcnn_polapp-b2_fpn_8xb2-amp-1x_coco.py')
MASK_RCNN_B2_3X = osp.join(DET_DIR, 'mask-rcnn_polapp-b2_fpn_8xb2-amp-ms-crop-3x_coco.py')
RETINANET_B2 = osp.join(DET_DIR, 'retinanet_polapp-b2_fpn_8xb2-amp-1x_coco.py')
CHANNELS = dict(b2=[64, 128, 256, 512], b3=[64, 128, 320, 512], b4=[96, 192, 384, 512],
                b5=[96, 192, 448, 640])
# the authors' per-config backbone settings (downstream/detection/configs/PolaPP/*.py)
DROP_PATH = dict(b2=0.1, b3=0.15, b4=0.4, b5=0.55)
LAYER_SCALE = dict(b2=[1, 1, 1, 1], b3=[1, 1, 1, 1], b4=[1, 1, 1e-6, 1e-6], b5=[1e-6] * 4)
# images in COCO train2017 after mmdet's filter (no empty images, short side >= 32): 117266,
# i.e. 7330 iterations of 16 images per epoch
COCO_EPOCH_ITERS = 7330


def _arch(path):
    return osp.basename(path).split('_')[1].split('-')[1]


def test_every_published_config_exists():
    assert {osp.basename(c) for c in CONFIGS} == PUBLISHED_CONFIGS
    import yaml
    with open(osp.join(DET_DIR, 'metafile.yml')) as f:
        models = yaml.safe_load(f)['Models']
    assert {m['Config'] for m in models} == {f'configs/detection/{n}' for n in PUBLISHED_CONFIGS}
    with open(osp.join(DET_DIR, 'README.md')) as f:
        readme = f.read()
    for name in PUBLISHED_CONFIGS:
        assert f'({name})' in readme, name
    for m in models:
        assert m['Metadata']['Batch Size'] == 16


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_config_settings(path):
    """The authors' recipe as config values, and the OpenMMLab conventions."""
    cfg = load_cfg(path)
    name = osp.basename(path)
    arch = _arch(path)
    assert cfg.default_scope == 'mmdet'
    assert {'polaformerpp', 'polaformerpp.datasets.coco_checks'} <= set(cfg.custom_imports.imports)
    backbone = cfg.model.backbone
    assert backbone.type == 'PolaFormerPP' and backbone.arch == arch
    assert backbone.frozen_stages == -1 and not backbone.norm_eval
    assert backbone.init_cfg == dict(
        type='Pretrained', checkpoint=f'checkpoints/polapp-{arch}_in1k.pth', prefix='backbone.')
    assert images_per_iteration(cfg) == 16  # 2 images/GPU x 8 GPUs
    assert cfg.auto_scale_lr.base_batch_size == 16
    optim = cfg.optim_wrapper
    # mmcv's Fp16OptimizerHook default (`fp16 = dict()`) and RetinaNet's `loss_scale=512.0`: static
    assert optim.type == 'AmpOptimWrapper' and optim.loss_scale == 512.0
    assert optim.optimizer.type == 'AdamW' and optim.optimizer.betas == (0.9, 0.999)
    assert optim.optimizer.lr == 1e-4 and optim.get('clip_grad') is None
    warmup, steps = cfg.param_scheduler
    # mmcv's 500-iteration warm-up (mmengine's LinearLR reaches its end factor at end - 1)
    assert warmup.type == 'LinearLR' and not warmup.by_epoch and warmup.end == 501
    assert warmup.start_factor == 0.001
    if name.startswith('retinanet'):
        assert optim.optimizer.weight_decay == 1e-4 and optim.paramwise_cfg is None
        # P3-P7: the FPN reads the stride-8/16/32 stage outputs, extra levels on the input
        assert tuple(backbone.out_indices) == (1, 2, 3)
        assert cfg.model.neck.in_channels == CHANNELS[arch][1:]
        assert cfg.model.neck.add_extra_convs == 'on_input' and cfg.model.neck.num_outs == 5
        assert cfg.model.bbox_head.anchor_generator.strides == [8, 16, 32, 64, 128]
        assert cfg.val_evaluator.metric == 'bbox'
    else:
        assert optim.optimizer.weight_decay == 0.05
        assert tuple(backbone.out_indices) == (0, 1, 2, 3)
        assert cfg.model.neck.in_channels == CHANNELS[arch]
        assert list(cfg.val_evaluator.metric) == ['bbox', 'segm']
    if '3x' in name:
        assert cfg.train_cfg.max_epochs == 36 and steps.milestones == [27, 33]
    else:
        assert cfg.train_cfg.max_epochs == 12 and steps.milestones == [8, 11]


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_built_model_follows_the_authors(path):
    """The optimizer mmengine builds for the real model, and the backbone's training state.

    Weight decay: Mask R-CNN exempts every parameter whose name (in the authors' module
    tree) contains 'norm', mmcv's substring rule; RetinaNet decays everything. No lr
    multipliers. Norm layers all train (nothing frozen, no norm_eval); drop path and
    layer-scale initial values are the authors' per-arch values.
    """
    cfg = load_cfg(path, **{'model.backbone.init_cfg': None})
    model = build_model(cfg)
    groups = optimizer_groups(cfg, model)
    assert {g['lr'] for g in groups} == {1e-4}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    decay = {n: g['weight_decay'] for g in groups for n in g['names']}
    assert set(decay) == trainable
    if cfg.model.type == 'RetinaNet':
        assert set(decay.values()) == {1e-4}
    else:
        expected = {n: 0.0 if 'norm' in authors_name(n) else 0.05 for n in trainable}
        assert decay == expected
        exempt = {n for n, wd in decay.items() if wd == 0}
        assert any('.stem.0.bn.' in n for n in trainable - exempt)  # the stem BNs are decayed
        assert any('.downsample.bn.' in n for n in exempt)
        assert any('.gamma1' in n for n in trainable - exempt)
    modes = norm_training_modes(model)
    assert modes and all(modes.values())
    arch = _arch(path)
    backbone = model.backbone
    drop_paths = [block.drop_path.drop_prob for stage in backbone.stages for block in stage.blocks]
    assert drop_paths[0] == 0 and drop_paths[-1] == pytest.approx(DROP_PATH[arch])
    assert [stage.blocks[0].gamma1[0].item() for stage in backbone.stages] == pytest.approx(LAYER_SCALE[arch])


def _authors_lr(iteration, steps, epoch_length, base_lr=1e-4, warmup_iters=500, warmup_ratio=0.001):
    """mmcv 1.x's step policy with linear warm-up (the authors' lr_config): lr x0.1 at each
    step epoch; over the first 500 iterations the lr rises linearly from 0.001 x lr."""
    epoch = iteration // epoch_length
    regular = base_lr * 0.1 ** sum(epoch >= s for s in steps)
    if iteration >= warmup_iters:
        return regular
    return regular * (1 - (1 - iteration / warmup_iters) * (1 - warmup_ratio))


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_learning_rate_schedule(path):
    cfg = load_cfg(path)
    length = COCO_EPOCH_ITERS
    steps = [27, 33] if '3x' in path else [8, 11]
    epochs = cfg.train_cfg.max_epochs
    iterations = [0, 1, 100, 250, 499, 500, 501, length, *(s * length + d for s in steps for d in (-1, 0)),
                  epochs * length - 1]
    assert lr_at(cfg, iterations, epoch_length=length) == pytest.approx(
        [_authors_lr(i, steps, length) for i in iterations], rel=1e-6)


def _check_train_pipeline(cfg, path):
    """1x: 1333x800 keeping the ratio, then a flip. 3x: the flip, then one of the authors' two
    AutoAugment policies (mmdet 2.x ``(short, long)`` scales, drawn uniformly)."""
    pipeline = cfg.train_dataloader.dataset.pipeline
    assert cfg.train_dataloader.dataset.filter_cfg == dict(filter_empty_gt=True, min_size=32)
    assert cfg.train_dataloader.batch_sampler.type == 'AspectRatioBatchSampler'
    if '3x' not in path:
        assert [t.type for t in pipeline] == ['LoadImageFromFile', 'LoadAnnotations', 'Resize', 'RandomFlip',
                                              'PackDetInputs']
        assert pipeline[2].scale == (1333, 800) and pipeline[2].keep_ratio and pipeline[3].prob == 0.5
        return
    assert [t.type for t in pipeline] == ['LoadImageFromFile', 'LoadAnnotations', 'RandomFlip', 'RandomChoice',
                                          'PackDetInputs']
    assert pipeline[2].prob == 0.5 and pipeline[3].get('prob') is None
    multi = [(s, 1333) for s in range(480, 801, 32)]  # the authors' img_scale lists

    def short_long(scales):
        return [(min(s), max(s)) for s in scales]

    (resize, ), (resize1, crop, resize2) = pipeline[3].transforms
    assert resize.type == 'RandomChoiceResize' and resize.keep_ratio and short_long(resize.scales) == multi
    assert resize1.type == 'RandomChoiceResize' and resize1.keep_ratio
    assert short_long(resize1.scales) == [(400, 1333), (500, 1333), (600, 1333)]
    assert crop == dict(type='RandomCrop', crop_type='absolute_range', crop_size=(384, 600),
                        allow_negative_crop=True)
    assert resize2.type == 'RandomChoiceResize' and resize2.keep_ratio and short_long(resize2.scales) == multi


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_data_and_evaluation_protocol(path):
    """The authors' train transforms; their test transform (1333x800 keeping the ratio, no flip,
    padding to a multiple of 32), one image per GPU, COCO val2017 every epoch, mmdet's
    post-processing settings."""
    cfg = load_cfg(path)
    _check_train_pipeline(cfg, path)
    assert cfg.test_dataloader == cfg.val_dataloader and cfg.test_evaluator == cfg.val_evaluator
    assert cfg.val_dataloader.batch_size == 1
    dataset = cfg.val_dataloader.dataset
    assert dataset.ann_file == 'annotations/instances_val2017.json'
    assert dataset.data_prefix.img == 'val2017/' and dataset.test_mode
    assert cfg.val_evaluator.type == 'CocoMetric'
    assert cfg.val_evaluator.ann_file.endswith('annotations/instances_val2017.json')
    assert cfg.train_cfg.val_interval == 1
    types = [t.type for t in dataset.pipeline]
    assert types == ['LoadImageFromFile', 'Resize', 'LoadAnnotations', 'PackDetInputs']
    assert dataset.pipeline[1].scale == (1333, 800) and dataset.pipeline[1].keep_ratio
    pre = cfg.model.data_preprocessor
    assert pre.mean == [123.675, 116.28, 103.53] and pre.std == [58.395, 57.12, 57.375]
    assert pre.bgr_to_rgb and pre.pad_size_divisor == 32
    nms = dict(type='nms', iou_threshold=0.5)
    if cfg.model.type == 'RetinaNet':
        assert cfg.model.test_cfg == dict(nms_pre=1000, min_bbox_size=0, score_thr=0.05, nms=nms,
                                          max_per_img=100)
    else:
        assert cfg.model.test_cfg == dict(
            rpn=dict(nms_pre=1000, max_per_img=1000, nms=dict(type='nms', iou_threshold=0.7), min_bbox_size=0),
            rcnn=dict(score_thr=0.05, nms=nms, max_per_img=100, mask_thr_binary=0.5))
        train = cfg.model.train_cfg
        assert train.rpn_proposal == dict(nms_pre=2000, max_per_img=1000, nms=dict(type='nms', iou_threshold=0.7),
                                          min_bbox_size=0)
        assert train.rpn.sampler.num == 256 and train.rcnn.sampler.num == 512 and train.rcnn.mask_size == 28


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_config_builds_and_runs_loss_and_predict(path):
    cfg = load_cfg(path, **{'model.backbone.init_cfg': None})
    if cfg.model.type == 'MaskRCNN':  # the configured network, with fewer RoIs per image on the CPU
        cfg.model.train_cfg.rpn_proposal.max_per_img = 64
        cfg.model.train_cfg.rcnn.sampler.num = 32
        cfg.model.test_cfg.rpn.max_per_img = 32
        cfg.model.test_cfg.rcnn.max_per_img = 8
    else:
        cfg.model.test_cfg.max_per_img = 8
    model = build_detector(cfg)
    import yaml
    with open(osp.join(DET_DIR, 'metafile.yml')) as f:
        listed = {m['Name']: m['Metadata']['Parameters'] for m in yaml.safe_load(f)['Models']}
    assert sum(p.numel() for p in model.parameters()) == listed[osp.basename(path)[:-3]]
    model.init_weights()
    is_mask_rcnn = cfg.model.type == 'MaskRCNN'
    model.train()
    data = demo_batch(model, with_mask=is_mask_rcnn, training=True)
    losses = model.parse_losses(model(**data, mode='loss'))[0]
    assert torch.isfinite(losses)
    model.eval()
    data = demo_batch(model, with_mask=is_mask_rcnn, training=False)
    with torch.no_grad():
        preds = model(**data, mode='predict')
    assert len(preds) == 2
    for pred, shape in zip(preds, ((97, 131), (120, 100))):
        boxes = pred.pred_instances.bboxes
        assert boxes.shape[1] == 4 and torch.isfinite(boxes).all()
        if is_mask_rcnn and len(boxes):
            assert tuple(pred.pred_instances.masks.shape[1:]) == shape


@pytest.mark.parametrize('path', [MASK_RCNN_B2, RETINANET_B2, MASK_RCNN_B2_3X], ids=osp.basename)
def test_data_pipelines_on_coco_format_data(path, demo_coco):
    """Train and test pipelines of the configs on real JPEGs + COCO json (CheckedCocoDataset)."""
    use_mmdet()
    from mmdet.registry import DATASETS
    cfg = load_cfg(path)
    is_mask = 'mask-rcnn' in path
    multi_scale = '3x' in path
    for split, loader in (('train', cfg.train_dataloader), ('val', cfg.test_dataloader)):
        ds_cfg = copy.deepcopy(loader.dataset)
        ds_cfg.update(data_root=demo_coco, ann_file=f'annotations/instances_{split}.json',
                      data_prefix=dict(img=f'{split}/'), metainfo=dict(classes=CLASSES))
        dataset = DATASETS.build(ds_cfg)
        assert type(dataset).__name__ == 'CheckedCocoDataset'
        for i in range(3):
            item = dataset[i]
            h, w = item['inputs'].shape[1:]
            assert max(h, w) <= 1333
            if multi_scale and split == 'train':  # short side 480-800 (these images are ~square)
                assert 480 <= min(h, w) <= 800, (h, w)
            else:  # 1333x800 single scale
                assert min(h, w) == 800 or max(h, w) == 1333, (h, w)
            gt = item['data_samples'].gt_instances
            if split == 'train' and not multi_scale:  # (the crop branch may cut every object)
                assert len(gt) > 0 and gt.labels.max() < len(CLASSES)
                if is_mask:
                    assert gt.masks.masks.shape == (len(gt), h, w)
