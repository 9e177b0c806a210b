"""The PolaFormer++ backbone inside mmseg segmentors: whole and sliding inference at
sizes not divisible by 32, loading an ImageNet checkpoint through init_cfg, frozen
stages and norm_eval."""
import copy
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from segmentation_testing import (
    SEG_DIR,
    TINY_ARCH,
    build_segmentor,
    init_mmseg,
    seg_batch,
    shrink_heads,
    single_thread,  # noqa: F401 (fixtures)
    sync_bn_to_bn,
)


@pytest.mark.parametrize('head', ['lightham', 'upernet'])
@pytest.mark.parametrize('size', [(83, 121), (45, 70)])
def test_whole_and_slide_inference_at_sizes_not_divisible_by_32(head, size):
    name = ('polapp-b1_lightham_8xb8-160k_ade20k-512x512.py' if head == 'lightham'
            else 'upernet_polapp-b2_8xb2-160k_ade20k-512x512.py')
    cfg = Config.fromfile(osp.join(SEG_DIR, name))
    model = build_segmentor(cfg.model, tiny=True).eval()
    h, w = size
    results = {}
    for mode, test_cfg in (('whole', dict(mode='whole')),
                           ('slide', dict(mode='slide', crop_size=(48, 48), stride=(32, 32))),
                           ('one_window', dict(mode='slide', crop_size=(256, 256), stride=(170, 170)))):
        model.test_cfg = Config(test_cfg)
        torch.manual_seed(0)  # LightHam's NMF starts from random bases
        with torch.no_grad():
            pred = model.test_step(seg_batch([size], 150))[0]
        assert pred.pred_sem_seg.shape == (h, w), mode
        assert pred.seg_logits.data.shape == (150, h, w), mode
        assert torch.isfinite(pred.seg_logits.data).all(), mode
        results[mode] = pred.seg_logits.data
    # a window covering the whole (padded) image is whole-image inference
    torch.testing.assert_close(results['one_window'], results['whole'], rtol=1e-4, atol=1e-4)


def _tiny_classifier_checkpoint(path):
    """A classification-style checkpoint: backbone weights under ``backbone.`` plus a head."""
    from polaformerpp.models.backbones import PolaFormerPP
    backbone = PolaFormerPP(arch=copy.deepcopy(TINY_ARCH), out_indices=(4, ))
    backbone.init_weights()
    for p in backbone.parameters():  # distinguishable from a fresh initialisation
        p.data.uniform_(-1, 1)
    state = {f'backbone.{k}': v for k, v in backbone.state_dict().items()}
    state['head.fc.weight'] = torch.zeros(10, 2048)
    torch.save(dict(state_dict=state, meta=dict()), path)
    return state


def test_backbone_loads_imagenet_checkpoint_through_init_cfg(tmp_path):
    ckpt = str(tmp_path / 'polapp-tiny_in1k.pth')
    state = _tiny_classifier_checkpoint(ckpt)
    cfg = Config.fromfile(osp.join(SEG_DIR, 'upernet_polapp-b2_8xb2-160k_ade20k-512x512.py'))
    init_mmseg()
    from mmseg.registry import MODELS
    model_cfg = copy.deepcopy(cfg.model)
    model_cfg.backbone.arch = copy.deepcopy(TINY_ARCH)
    shrink_heads(model_cfg, TINY_ARCH['embed_dims'])
    model_cfg.backbone.init_cfg = dict(type='Pretrained', checkpoint=ckpt, prefix='backbone.')
    sync_bn_to_bn(model_cfg)
    model = MODELS.build(model_cfg)
    model.init_weights()
    loaded = model.backbone.state_dict()
    for key, value in loaded.items():
        if key.startswith('norm'):  # the dense outputs' norms are new (missing in the checkpoint)
            assert f'backbone.{key}' not in state
            continue
        torch.testing.assert_close(value, state[f'backbone.{key}'], msg=key)
    assert not hasattr(model.backbone, 'cls_proj')  # the classifier's projection is not built


def test_frozen_stages_and_norm_eval_are_honoured():
    cfg = Config.fromfile(osp.join(SEG_DIR, 'polapp-b1_lightham_8xb8-160k_ade20k-512x512.py'))
    model = build_segmentor(cfg.model, tiny=True, frozen_stages=2, norm_eval=True)
    model.train()
    bb = model.backbone
    frozen = [bb.stem, bb.stages[0], bb.stages[1]]
    assert all(not p.requires_grad for m in frozen for p in m.parameters())
    assert all(p.requires_grad for p in bb.stages[2].parameters())
    bns = [m for m in bb.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and all(not m.training for m in bns)
    assert model.decode_head.training
    data = model.data_preprocessor(seg_batch([(64, 64), (64, 64)], 150), True)
    losses = model(**data, mode='loss')
    losses['decode.loss_ce'].backward()
    assert all(p.grad is None for m in frozen for p in m.parameters())
    assert bb.stages[3].blocks[0].gamma1.grad is not None
