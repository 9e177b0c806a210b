"""The PolaFormer++ backbone inside mmdet detectors: optimizer parameter groups,
frozen stages and norm_eval, odd input sizes, NCHW outputs for mmcv's RoIAlign,
loading a classification checkpoint."""
import os.path as osp

import pytest
import torch

from conftest import load_tool
from detection_testing import (
    CLASSES,
    CLS_DEMO_CONFIG,
    MASK_RCNN_B2,
    RETINANET_B2,
    TINY,
    build_detector,
    demo_batch,
    load_cfg,
    one_thread,  # noqa: F401 (fixtures)
)


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
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS

    import polaformerpp  # noqa: F401
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
