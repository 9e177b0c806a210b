"""COCO detection and instance segmentation (mmdet 3.3) over the PolaFormer++ backbone.

Fast tests: every detection config builds (model, data pipeline, optimizer) and
runs a loss and a predict forward on small CPU images; backbone behaviour inside
a detector (frozen stages, norm_eval, loading a classification checkpoint,
odd input sizes); clear errors for broken COCO annotation files.

Slow tests (``-m slow``): short Mask R-CNN and RetinaNet runs through
``tools/train.py`` on the generated COCO-format shapes set with a tiny arch,
evaluation through ``tools/test.py`` with mmdet's ``CocoMetric``, a run through
``tools/dist_train.sh`` with 2 CPU processes, and ``get_flops.py`` at 1280x800.
"""
import copy
import glob
import json
import math
import os
import os.path as osp
import shutil
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config

from conftest import REPO_ROOT, free_port, load_tool, run_tool

DET_DIR = osp.join(REPO_ROOT, 'configs', 'detection')
CONFIGS = sorted(glob.glob(osp.join(DET_DIR, '*.py')))
ISSUE_CONFIGS = {
    *(f'retinanet_polapp-{a}_fpn_1x_coco.py' for a in ('b2', 'b3')),
    *(f'mask-rcnn_polapp-{a}_fpn_1x_coco.py' for a in ('b2', 'b3', 'b4', 'b5')),
    *(f'mask-rcnn_polapp-{a}_fpn_ms-crop-3x_coco.py' for a in ('b2', 'b3', 'b4')),
}
MASK_RCNN_B2 = 'configs/detection/mask-rcnn_polapp-b2_fpn_1x_coco.py'
RETINANET_B2 = 'configs/detection/retinanet_polapp-b2_fpn_1x_coco.py'
CLS_DEMO_CONFIG = 'configs/classification/polapp-b0_1xb32-30e_demo-shapes.py'
CHANNELS = dict(b2=[64, 128, 256, 512], b3=[64, 128, 320, 512], b4=[96, 192, 384, 512],
                b5=[96, 192, 448, 640])
# a small arch for CPU runs (softmax stages need head dims divisible by 4)
TINY = dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 4])
CLASSES = ('disk', 'square', 'triangle')
# TINY as config source, replacing the base config's arch name
TINY_SRC = 'dict(_delete_=True, ' + ', '.join(f'{k}={v!r}' for k, v in TINY.items()) + ')'


# ------------------------------------------------------------------------------------ helpers
def use_mmdet():
    """Register the project's modules and make mmdet the default scope."""
    import polaformerpp  # noqa: F401
    import polaformerpp.datasets.coco_checks  # noqa: F401
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')


def load_cfg(path, **options):
    """The config at ``path`` with ``options`` (``'a.b.c': value``) set, replacing what was there."""
    cfg = Config.fromfile(path if osp.isabs(path) else osp.join(REPO_ROOT, path))
    for key, value in options.items():
        *parents, leaf = key.split('.')
        node = cfg
        for name in parents:
            node = node[name]
        node[leaf] = copy.deepcopy(value)
    return cfg


def build_detector(cfg):
    use_mmdet()
    from mmdet.registry import MODELS
    return MODELS.build(cfg.model)


def tiny_mask_rcnn_options(**extra):
    options = {
        'model.backbone.arch': TINY, 'model.backbone.drop_path_rate': 0.0,
        'model.backbone.init_cfg': None, 'model.neck.in_channels': TINY['embed_dims'],
        'model.neck.out_channels': 32,
        'model.rpn_head.in_channels': 32, 'model.rpn_head.feat_channels': 32,
        'model.roi_head.bbox_roi_extractor.out_channels': 32,
        'model.roi_head.bbox_head.in_channels': 32,
        'model.roi_head.bbox_head.fc_out_channels': 64,
        'model.roi_head.bbox_head.num_classes': len(CLASSES),
        'model.roi_head.mask_roi_extractor.out_channels': 32,
        'model.roi_head.mask_head.in_channels': 32, 'model.roi_head.mask_head.num_convs': 1,
        'model.roi_head.mask_head.conv_out_channels': 32,
        'model.roi_head.mask_head.num_classes': len(CLASSES),
    }
    options.update(extra)
    return options


def demo_batch(model, shapes=((3, 97, 131), (3, 120, 100)), num_classes=80, with_mask=True,
               training=True):
    """mmdet's packed demo inputs (random boxes and masks) through the model's preprocessor."""
    from mmdet.testing import demo_mm_inputs
    torch.manual_seed(0)
    packed = demo_mm_inputs(batch_size=len(shapes), image_shapes=list(shapes), num_items=[3, 2],
                            num_classes=num_classes, with_mask=with_mask)
    return model.data_preprocessor(packed, training)


def read_scalars(work_dir):
    logs = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    assert logs, f'no scalars.json under {work_dir}'
    with open(logs[-1]) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a small shared CPU, OpenMP threads competing with other
    processes slow these small forwards down by an order of magnitude."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run(args, **kwargs):
    """``run_tool`` with one OpenMP thread per process (see ``one_thread``)."""
    env = dict(OMP_NUM_THREADS='1', **kwargs.pop('env', {}))
    return run_tool(args, env=env, **kwargs)


@pytest.fixture(scope='module')
def demo_coco(tmp_path_factory):
    """The generated COCO-format shapes set: 32 train / 12 val JPEGs, 3 categories."""
    make = load_tool('tools/misc/make_demo_coco.py').make_demo_coco
    root = str(tmp_path_factory.mktemp('demo_coco'))
    make(root, num_train=32, num_val=12, num_classes=len(CLASSES), seed=0)
    return root


# ------------------------------------------------------------------------------------ configs
def test_every_issue_config_exists():
    assert {osp.basename(c) for c in CONFIGS} == ISSUE_CONFIGS
    import yaml
    with open(osp.join(DET_DIR, 'metafile.yml')) as f:
        models = yaml.safe_load(f)['Models']
    assert {m['Config'] for m in models} == {f'configs/detection/{n}' for n in ISSUE_CONFIGS}
    with open(osp.join(DET_DIR, 'README.md')) as f:
        readme = f.read()
    for name in ISSUE_CONFIGS:
        assert f'({name})' in readme, name
    for m in models:
        assert m['Metadata']['Batch Size'] == 16


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_config_settings(path):
    """The published settings (SPEC section 3) and the OpenMMLab conventions."""
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
        assert cfg.train_pipeline[2] == dict(type='Resize', scale=(1333, 800), keep_ratio=True)


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


# ----------------------------------------------------------------------- backbone in a detector
def test_optimizer_param_groups_have_no_decay_on_norms_layer_scales_temperatures():
    from mmengine.optim import build_optim_wrapper
    cfg = load_cfg(MASK_RCNN_B2, **tiny_mask_rcnn_options())
    model = build_detector(cfg)
    cfg.optim_wrapper.type = 'OptimWrapper'
    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    decay = {}
    for group in wrapper.optimizer.param_groups:
        for p in group['params']:
            decay[id(p)] = group['weight_decay']
    names = dict(model.named_parameters())
    for key in ('gamma1', 'gamma2', 'temp_same', 'temp_opp', 'norm0.weight', 'norm1.norm',
                'stem.0.bn.weight'):
        hits = [n for n in names if key in n]
        assert all(decay[id(names[n])] == 0 for n in hits), key
    assert any('temp_same' in n for n in names) and any('norm0' in n for n in names)
    assert decay[id(names['backbone.stages.0.blocks.0.attn.qkvg.weight'])] == 0.05
    assert decay[id(names['neck.lateral_convs.0.conv.weight'])] == 0.05


def test_frozen_stages_and_norm_eval_in_detector():
    cfg = load_cfg(MASK_RCNN_B2, **tiny_mask_rcnn_options(**{
        'model.backbone.frozen_stages': 2, 'model.backbone.norm_eval': True}))
    model = build_detector(cfg)
    model.init_weights()
    model.train()
    backbone = model.backbone
    bn_stats = {n: b.clone() for n, b in backbone.named_buffers() if 'running' in n}
    assert bn_stats
    data = demo_batch(model, num_classes=len(CLASSES), training=True)
    loss = model.parse_losses(model(**data, mode='loss'))[0]
    loss.backward()
    for name, buf in backbone.named_buffers():
        if name in bn_stats:
            torch.testing.assert_close(buf, bn_stats[name], msg=name)  # norm_eval: stats frozen
    frozen = ('stem.', 'stages.0.', 'stages.1.', 'norm0.', 'norm1.')
    for name, p in backbone.named_parameters():
        if name.startswith(frozen):
            assert not p.requires_grad and p.grad is None, name
        else:
            assert p.requires_grad, name
    assert backbone.stages[2].blocks[0].gamma1.grad is not None
    assert not any(m.training for m in backbone.modules()
                   if isinstance(m, torch.nn.modules.batchnorm._BatchNorm))


def test_odd_input_sizes_without_padding():
    """No divisibility assumption: the pyramid follows the (rounded-up) strides 4..64."""
    cfg = load_cfg(MASK_RCNN_B2, **tiny_mask_rcnn_options(
        **{'model.data_preprocessor.pad_size_divisor': 1}))
    model = build_detector(cfg).eval()
    data = demo_batch(model, shapes=((3, 75, 109), (3, 75, 109)), num_classes=len(CLASSES),
                      training=False)
    assert tuple(data['inputs'].shape[2:]) == (75, 109)
    with torch.no_grad():
        feats = model.extract_feat(data['inputs'])
        preds = model(**data, mode='predict')
    sizes = [tuple(f.shape[2:]) for f in feats]
    assert sizes == [(19, 28), (10, 14), (5, 7), (3, 4), (2, 2)]
    assert len(preds) == 2

    cfg = load_cfg(RETINANET_B2, **{
        'model.backbone.arch': TINY, 'model.backbone.init_cfg': None,
        'model.neck.in_channels': TINY['embed_dims'][1:], 'model.neck.out_channels': 32,
        'model.bbox_head.in_channels': 32, 'model.bbox_head.feat_channels': 32,
        'model.data_preprocessor.pad_size_divisor': 1})
    model = build_detector(cfg).eval()
    with torch.no_grad():
        feats = model.extract_feat(data['inputs'])
    assert [tuple(f.shape[2:]) for f in feats] == [(10, 14), (5, 7), (3, 4), (2, 2), (1, 1)]


def test_dense_outputs_are_nchw_for_mmcv_roi_align():
    """mmcv's RoIAlign (the RoI extractors of Mask R-CNN) reads its input as contiguous NCHW
    memory: features in another memory layout (e.g. channels-last, which convolutions
    propagate from their input) give wrong RoI features and a mask loss that grows in
    training. Backbone outputs and FPN levels must be plain NCHW."""
    import torchvision
    from mmcv.ops import roi_align
    cfg = load_cfg(MASK_RCNN_B2, **tiny_mask_rcnn_options())
    model = build_detector(cfg).eval()
    x = torch.randn(2, 3, 96, 128)
    with torch.no_grad():
        outs = model.backbone(x)
        feats = model.neck(outs)
    assert all(o.is_contiguous() for o in outs), [o.stride() for o in outs]
    assert all(f.is_contiguous() for f in feats), [f.stride() for f in feats]
    rois = torch.tensor([[0, 4.5, 6.0, 60.0, 50.5], [1, 30.0, 20.0, 120.0, 90.0]])
    got = roi_align(feats[0], rois, (7, 7), 0.25, 0, 'avg', True)
    expected = torchvision.ops.roi_align(feats[0], rois, (7, 7), 0.25, 0, True)
    torch.testing.assert_close(got, expected)


def make_classification_checkpoint(path, source):
    """A classifier of the tiny arch saved as ``source`` writes it: ``'train'``, a Runner
    checkpoint as tools/train.py saves it (``state_dict`` with the backbone under
    ``backbone.``, its classification projection ``cls_proj`` included, no dense-output
    norms, and ``head.``); ``'converter'``, the same weights in the authors' layout converted
    by tools/model_converters/polapp_official2mm.py. Returns the backbone's weights."""
    import polaformerpp  # noqa: F401
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    init_default_scope('mmpretrain')
    cfg = load_cfg(CLS_DEMO_CONFIG, **{'model.backbone.arch': TINY})
    classifier = MODELS.build(cfg.model)
    classifier.init_weights()
    with torch.no_grad():
        for p in classifier.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # not the initial values
    state = classifier.state_dict()
    if source == 'train':
        torch.save({'meta': dict(epoch=1, iter=5), 'state_dict': state}, path)
    else:
        converter = load_tool('tools/model_converters/polapp_official2mm.py')
        official = {}
        for key, value in state.items():
            name = converter.official_key(key)
            assert name is not None, key
            if name.endswith(('attn.s1', 'attn.s2')):  # (h, 2d) -> the authors' (1, h, 1, 2d)
                value = value[None, :, None, :]
            official[name] = value
        for i, (dims, heads) in enumerate(zip(TINY['embed_dims'], TINY['num_heads'])):
            official[f'layers.{i}.RoPE.angle'] = converter.expected_rope_angle(dims // heads // 2)
            official[f'layers.{i}.RoPE_linear.angle'] = converter.expected_rope_angle(dims // heads)
        src = osp.join(osp.dirname(path), 'authors.pth')
        torch.save({'model': official}, src)
        converter.convert_file(src, path, log=lambda *args: None)
    return {k[len('backbone.'):]: v for k, v in state.items() if k.startswith('backbone.')}


@pytest.mark.parametrize('source', ['train', 'converter'])
def test_classification_checkpoint_loads_into_detector_backbone(tmp_path, source):
    from mmengine.logging import MMLogger
    ckpt = str(tmp_path / 'cls.pth')
    cls_backbone = make_classification_checkpoint(ckpt, source)
    cfg = load_cfg(MASK_RCNN_B2, **tiny_mask_rcnn_options(**{
        'model.backbone.init_cfg': dict(type='Pretrained', checkpoint=ckpt, prefix='backbone.')}))
    model = build_detector(cfg)

    import logging
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        model.init_weights()
    finally:
        logger.removeHandler(handler)
    det_backbone = model.backbone.state_dict()
    shared = [k for k in cls_backbone if k in det_backbone]
    assert len(shared) > 50
    for k in shared:
        torch.testing.assert_close(det_backbone[k], cls_backbone[k], msg=k)
    log = '\n'.join(messages)
    assert 'missing keys in source state_dict' in log and 'norm0.weight' in log, log
    assert 'unexpected key in source state_dict' in log and 'cls_proj.conv.weight' in log, log
    unexpected = [line for line in log.splitlines() if line.startswith('unexpected key')]
    assert len(unexpected) == 1 and 'head.' not in unexpected[0]  # the prefix selects the backbone


# ------------------------------------------------------------------------------ broken annotations
def dataset_cfg(root, ann='annotations/instances_train.json', split='train', **kwargs):
    cfg = dict(type='CheckedCocoDataset', data_root=root, ann_file=ann,
               data_prefix=dict(img=f'{split}/'), metainfo=dict(classes=CLASSES),
               filter_cfg=dict(filter_empty_gt=True, min_size=32),
               pipeline=[dict(type='LoadImageFromFile')])
    cfg.update(kwargs)
    return cfg


def broken_copy(demo_coco, tmp_path, edit):
    """A copy of the demo set's train split whose json has been changed by ``edit``."""
    root = str(tmp_path / 'broken')
    shutil.copytree(osp.join(demo_coco, 'train'), osp.join(root, 'train'))
    os.makedirs(osp.join(root, 'annotations'))
    with open(osp.join(demo_coco, 'annotations', 'instances_train.json')) as f:
        coco = json.load(f)
    edit(coco)
    with open(osp.join(root, 'annotations', 'instances_train.json'), 'w') as f:
        json.dump(coco, f)
    return root


def build_dataset(cfg):
    use_mmdet()
    from mmdet.registry import DATASETS
    return DATASETS.build(cfg)


def test_checked_dataset_matches_coco_dataset(demo_coco):
    dataset = build_dataset(dataset_cfg(demo_coco))
    plain = build_dataset(dict(dataset_cfg(demo_coco), type='CocoDataset'))
    assert len(dataset) == len(plain) == 32
    assert [d['instances'] for d in dataset.data_list] == [d['instances'] for d in plain.data_list]


def _set_category(coco):
    coco['annotations'][3]['category_id'] = 42


def _no_images(coco):
    coco['images'] = []
    coco['annotations'] = []


def _no_annotations(coco):
    coco['annotations'] = []


def _no_bbox(coco):
    del coco['annotations'][0]['bbox']


def _bad_image_id(coco):
    coco['annotations'][1]['image_id'] = 999


def _dup_category(coco):
    coco['categories'].append(dict(coco['categories'][0]))


@pytest.mark.parametrize('edit, error, words', [
    (_set_category, ValueError, ["category_id that is not in 'categories'", 'category_id 42',
                                 'annotation id 4', 'Expected one of the category ids [1, 2, 3]']),
    (_no_images, ValueError, ['lists no images']),
    (_no_annotations, ValueError, ['no image is left after filter_cfg', "'disk'"]),
    (_no_bbox, ValueError, ['malformed annotations', 'annotations[0]']),
    (_bad_image_id, ValueError, ["image_id that is not in 'images'", 'image_id 999']),
    (_dup_category, ValueError, ['duplicate category ids [1]']),
], ids=['wrong-category-id', 'no-images', 'nothing-after-filter', 'no-bbox', 'wrong-image-id',
        'duplicate-category'])
def test_broken_annotations_raise_clear_errors(demo_coco, tmp_path, edit, error, words):
    root = broken_copy(demo_coco, tmp_path, edit)
    with pytest.raises(error) as info:
        build_dataset(dataset_cfg(root))
    message = str(info.value)
    assert 'instances_train.json' in message, message
    for w in words:
        assert w in message, message


def test_missing_files_raise_clear_errors(demo_coco, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"ann_file '.*annotations/nope.json' does not exist"):
        build_dataset(dataset_cfg(demo_coco, ann='annotations/nope.json'))
    root = broken_copy(demo_coco, tmp_path, lambda coco: None)
    os.remove(osp.join(root, 'train', '000005.jpg'))
    with pytest.raises(FileNotFoundError, match=r"1 of the 32 images .* do not exist .*000005.jpg"):
        build_dataset(dataset_cfg(root))
    assert len(build_dataset(dataset_cfg(root, check_images=False))) == 32


def test_wrong_classes_and_bad_json_raise_clear_errors(demo_coco, tmp_path):
    with pytest.raises(ValueError, match=r"1 of the dataset's 2 classes, \['cat'\], are not "
                       r"category names .*\['disk', 'square', 'triangle'\]"):
        build_dataset(dataset_cfg(demo_coco, metainfo=dict(classes=('disk', 'cat'))))
    # the val split in test mode: no filtering, every image kept
    assert len(build_dataset(dataset_cfg(demo_coco, ann='annotations/instances_val.json',
                                         split='val', test_mode=True))) == 12
    bad = tmp_path / 'bad.json'
    bad.write_text('{"images": [')
    with pytest.raises(ValueError, match='is not valid JSON'):
        build_dataset(dataset_cfg(demo_coco, ann=str(bad)))
    bad.write_text('{"images": [{"id": 1}], "annotations": [{"id": 1}], "categories": []}')
    with pytest.raises(ValueError, match='is not a COCO annotation file'):
        build_dataset(dataset_cfg(demo_coco, ann=str(bad)))


# ------------------------------------------------------------------------------------ end to end
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
    assert last < 0.75 * first, (first, last)
    ckpt = osp.join(work_dir, f'epoch_{epochs}.pth')
    assert osp.isfile(ckpt)
    out = str(tmp_path / 'metrics.json')
    run(['tools/test.py', config, ckpt, '--work-dir', work_dir, '--out-json', out])
    with open(out) as f:
        results = json.load(f)
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
    run(['tools/train.py', str(cls_config), '--work-dir', cls_dir, '--no-validate'])
    cls_ckpt = osp.join(cls_dir, 'epoch_1.pth')
    assert osp.isfile(cls_ckpt)

    epochs = 8
    config = write_tiny_config(tmp_path / 'mask_rcnn_tiny.py', MASK_RCNN_B2, demo_coco, epochs,
                               init_checkpoint=cls_ckpt)
    work_dir = str(tmp_path / 'work')
    proc = run(['tools/train.py', config, '--work-dir', work_dir])
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
    run(['tools/train.py', config, '--work-dir', work_dir])
    check_train_and_test(tmp_path, config, work_dir, epochs, ['coco/bbox_mAP', 'coco/bbox_mAP_50'],
                         learned=['coco/bbox_mAP_50'])


@pytest.mark.slow
def test_mask_rcnn_dist_train_two_cpu_processes(demo_coco, tmp_path):
    epochs = 6
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
    root = broken_copy(demo_coco, tmp_path, _set_category)
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
    proc = run(['tools/analysis_tools/get_flops.py', MASK_RCNN_B2])
    assert 'Input shape: (3, 800, 1280)' in proc.stdout, proc.stdout
    flops = float(proc.stdout.split('Flops: ')[1].split('G')[0])
    assert 100 < flops < 1000, proc.stdout
