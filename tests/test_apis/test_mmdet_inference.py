"""mmdet's own inference APIs on the detection configs: ``init_detector`` +
``inference_detector`` and ``DetInferencer``, on a plain photograph (no annotations)."""
import copy

import pytest
import torch

from apis_testing import (
    IMG_H,
    IMG_W,
    astronaut_bgr,
    config_id,
    configs_of,
    load,
    one_thread,  # noqa: F401 (fixture)
    perturb,
    save_weights,
    tiny_backbone,
)

DET_CONFIGS = configs_of('detection')
MAIN_CONFIG = 'configs/detection/mask-rcnn_polapp-b2_fpn_8xb2-amp-1x_coco.py'


def _tiny(path, scale=None, max_per_img=20):
    """The config with a tiny backbone and a score threshold of 0, so that untrained weights
    still give boxes to check, and fewer proposals (speed); ``scale`` shrinks the test resize
    (the configs' 1333x800 else)."""
    cfg = tiny_backbone(load(path))
    if 'rpn' in cfg.model.test_cfg:
        cfg.model.test_cfg.rpn.update(nms_pre=200, max_per_img=100)
    test_cfg = cfg.model.test_cfg.get('rcnn', cfg.model.test_cfg)
    test_cfg.score_thr = 0.0
    test_cfg.max_per_img = max_per_img
    if scale is not None:
        for step in cfg.test_dataloader.dataset.pipeline:
            if step.type == 'Resize':
                step.scale = scale
    return cfg


def _check(sample, num_classes, with_mask, max_per_img=20):
    from mmdet.structures import DetDataSample
    assert isinstance(sample, DetDataSample)
    assert sample.ori_shape == (IMG_H, IMG_W)
    pred = sample.pred_instances
    n = len(pred)
    assert 0 < n <= max_per_img
    boxes = pred.bboxes
    assert boxes.shape == (n, 4)
    # in pixels of the input image: inside it, x1 <= x2, y1 <= y2
    assert boxes[:, 0].min() >= 0 and boxes[:, 1].min() >= 0
    assert boxes[:, 2].max() <= IMG_W and boxes[:, 3].max() <= IMG_H
    assert (boxes[:, 2] >= boxes[:, 0]).all() and (boxes[:, 3] >= boxes[:, 1]).all()
    assert ((pred.scores >= 0) & (pred.scores <= 1)).all()
    assert pred.labels.min() >= 0 and pred.labels.max() < num_classes
    if with_mask:
        assert pred.masks.shape == (n, IMG_H, IMG_W) and pred.masks.dtype == torch.bool


def _num_classes(cfg):
    head = cfg.model.get('roi_head', {}).get('bbox_head', cfg.model.get('bbox_head'))
    return head.num_classes


@pytest.mark.parametrize('path', DET_CONFIGS, ids=config_id)
def test_init_detector_and_inference_detector(path):
    from mmdet.apis import inference_detector, init_detector
    cfg = _tiny(path, scale=(320, 192))
    model = init_detector(cfg, device='cpu')
    assert not model.training and model.cfg is cfg
    sample = inference_detector(model, astronaut_bgr())  # a BGR array, as mmcv.imread gives
    _check(sample, _num_classes(cfg), with_mask='roi_head' in cfg.model)


@pytest.mark.slow
def test_inference_with_checkpoint_and_det_inferencer(tmp_path):
    import mmcv
    from mmdet.apis import DetInferencer, inference_detector, init_detector
    cfg = _tiny(MAIN_CONFIG)  # the config's own test pipeline (1333x800)
    ckpt = save_weights(perturb(init_detector(copy.deepcopy(cfg), device='cpu')), tmp_path / 'det.pth',
                        dataset_meta=dict(classes=tuple(f'c{i}' for i in range(80))))
    model = init_detector(copy.deepcopy(cfg), ckpt, device='cpu')
    assert model.dataset_meta['classes'][:2] == ('c0', 'c1')
    img = astronaut_bgr()
    img_path = str(tmp_path / 'astronaut.png')
    mmcv.imwrite(img, img_path)
    from_file = inference_detector(model, img_path)
    _check(from_file, 80, with_mask=True)

    inferencer = DetInferencer(model=copy.deepcopy(cfg), weights=ckpt, device='cpu')
    out = inferencer(img, return_datasamples=True)['predictions'][0]
    _check(out, 80, with_mask=True)
    torch.testing.assert_close(out.pred_instances.bboxes, from_file.pred_instances.bboxes)
    plain = inferencer(img_path, no_save_pred=True)['predictions'][0]  # the dict API
    assert set(plain) >= {'labels', 'scores', 'bboxes', 'masks'}
    assert len(plain['bboxes']) == len(from_file.pred_instances)


@pytest.mark.slow
@pytest.mark.parametrize('path', DET_CONFIGS, ids=config_id)
def test_real_arch_builds_through_init_detector(path):
    from mmdet.apis import init_detector
    model = init_detector(load(path), device='cpu')
    assert model.backbone.embed_dims == model.backbone.arch_settings['embed_dims']
    assert model.neck.in_channels == [model.backbone.embed_dims[i] for i in model.backbone.out_indices]
