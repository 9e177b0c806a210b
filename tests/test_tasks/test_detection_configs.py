"""COCO detection and instance segmentation configs (mmdet 3.3): every config carries
the published settings, builds (model, data pipeline) and runs a loss and a predict
forward on small CPU images, and its pipelines read COCO-format data."""
import copy
import glob
import os.path as osp

import pytest
import torch

from conftest import REPO_ROOT
from detection_testing import (  # noqa: F401 (fixtures)
    CLASSES,
    MASK_RCNN_B2,
    RETINANET_B2,
    build_detector,
    demo_batch,
    demo_coco,
    load_cfg,
    one_thread,
    use_mmdet,
)

DET_DIR = osp.join(REPO_ROOT, 'configs', 'detection')
CONFIGS = sorted(glob.glob(osp.join(DET_DIR, '*.py')))
# the published configs: RetinaNet b2/b3, Mask R-CNN 1x b2-b5 and 3x b2-b4
PUBLISHED_CONFIGS = {
    *(f'retinanet_polapp-{a}_fpn_1x_coco.py' for a in ('b2', 'b3')),
    *(f'mask-rcnn_polapp-{a}_fpn_1x_coco.py' for a in ('b2', 'b3', 'b4', 'b5')),
    *(f'mask-rcnn_polapp-{a}_fpn_ms-crop-3x_coco.py' for a in ('b2', 'b3', 'b4')),
}
CHANNELS = dict(b2=[64, 128, 256, 512], b3=[64, 128, 320, 512], b4=[96, 192, 384, 512],
                b5=[96, 192, 448, 640])


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
    """The published settings (the paper's COCO recipe) and the OpenMMLab conventions."""
    cfg = load_cfg(path)
    name = osp.basename(path)
    arch = name.split('_')[1].split('-')[1]
    assert cfg.default_scope == 'mmdet'
    assert {'polaformerpp', 'polaformerpp.datasets.coco_checks'} <= set(cfg.custom_imports.imports)
    backbone = cfg.model.backbone
    assert backbone.type == 'PolaFormerPP' and backbone.arch == arch
    assert backbone.init_cfg == dict(
        type='Pretrained', checkpoint=f'checkpoints/polapp-{arch}_in1k.pth', prefix='backbone.')
    assert cfg.train_dataloader.batch_size == 2  # x 8 GPUs
    assert cfg.auto_scale_lr.base_batch_size == 16
    optim = cfg.optim_wrapper
    assert optim.type == 'AmpOptimWrapper' and optim.optimizer.type == 'AdamW'
    assert optim.optimizer.lr == 1e-4
    assert optim.paramwise_cfg.norm_decay_mult == 0
    assert all(optim.paramwise_cfg.custom_keys[k].decay_mult == 0
               for k in ('.gamma1', '.gamma2', '.temp_same', '.temp_opp'))
    warmup, steps = cfg.param_scheduler
    assert warmup.type == 'LinearLR' and not warmup.by_epoch and warmup.end == 500
    if name.startswith('retinanet'):
        assert optim.optimizer.weight_decay == 1e-4
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
        choice = cfg.train_pipeline[3]
        assert choice.type == 'RandomChoice'
        short_sides = sorted(min(s) for s in choice.transforms[0][0].scales)
        assert short_sides[0] == 480 and short_sides[-1] == 800
        assert choice.transforms[1][1].type == 'RandomCrop'
    else:
        assert cfg.train_cfg.max_epochs == 12 and steps.milestones == [8, 11]
        # the transform comes from mmdet's dataset base, which mmengine tags with its scope
        assert cfg.train_pipeline[2] == dict(type='Resize', scale=(1333, 800), keep_ratio=True,
                                             _scope_='mmdet')


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


@pytest.mark.parametrize('path', [MASK_RCNN_B2, RETINANET_B2,
                                  'configs/detection/mask-rcnn_polapp-b2_fpn_ms-crop-3x_coco.py'],
                         ids=osp.basename)
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
