"""mmseg's own inference APIs on the segmentation configs: ``init_model`` +
``inference_model`` and ``MMSegInferencer``, on a plain photograph (no label map)."""
import copy

import numpy as np
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

SEG_CONFIGS = configs_of('segmentation')
MAIN_CONFIG = 'configs/segmentation/polapp-b2_lightham_8xb8-160k_ade20k-512x512.py'


def _check(sample, num_classes):
    from mmseg.structures import SegDataSample
    assert isinstance(sample, SegDataSample)
    pred = sample.pred_sem_seg.data
    assert pred.shape == (1, IMG_H, IMG_W)  # the input image's size
    assert pred.dtype == torch.int64 and 0 <= int(pred.min()) and int(pred.max()) < num_classes
    assert sample.seg_logits.data.shape == (num_classes, IMG_H, IMG_W)


def test_check_seg_map_shape_skips_images_without_annotations():
    from polaformerpp.datasets.seg_checks import CheckSegMapShape
    check = CheckSegMapShape()
    plain = dict(img=np.zeros((4, 5, 3), np.uint8), ori_shape=(4, 5), img_path=None)
    assert check(dict(plain)) == plain
    assert check(dict(plain, seg_map_path=None)) is not None  # a split without a label folder
    with pytest.raises(KeyError, match=r'gt_seg_map.*a\.png.*after LoadAnnotations'):
        check(dict(plain, seg_map_path='a.png'))
    with pytest.raises(ValueError, match='is 4x6'):
        check(dict(plain, seg_map_path='a.png', gt_seg_map=np.zeros((4, 6), np.uint8)))


@pytest.mark.parametrize('path', SEG_CONFIGS, ids=config_id)
def test_init_model_and_inference_model(path):
    from mmseg.apis import inference_model, init_model
    cfg = tiny_backbone(load(path))
    model = init_model(cfg, device='cpu')
    assert not model.training and model.cfg is cfg
    sample = inference_model(model, astronaut_bgr())  # a BGR array, as mmcv.imread gives
    _check(sample, cfg.model.decode_head.num_classes)


def test_inference_with_checkpoint_and_mmseg_inferencer(tmp_path):
    import mmcv
    from mmseg.apis import MMSegInferencer, inference_model, init_model
    cfg = tiny_backbone(load(MAIN_CONFIG))
    ade_meta = dict(classes=tuple(f'c{i}' for i in range(150)), palette=[[i, i, i] for i in range(150)])
    ckpt = save_weights(perturb(init_model(copy.deepcopy(cfg), device='cpu')), tmp_path / 'seg.pth',
                        dataset_meta=ade_meta)
    model = init_model(copy.deepcopy(cfg), ckpt, device='cpu')
    assert model.dataset_meta['classes'][:2] == ('c0', 'c1')
    img = astronaut_bgr()
    img_path = str(tmp_path / 'astronaut.png')
    mmcv.imwrite(img, img_path)
    # a path first: mmseg's inference_model switches model.cfg's loader to arrays for good;
    # the seeds: LightHam's NMF starts from random bases at test time too
    torch.manual_seed(0)
    from_file = inference_model(model, img_path)
    torch.manual_seed(0)
    from_array = inference_model(model, img)
    _check(from_array, 150)
    assert torch.equal(from_array.pred_sem_seg.data, from_file.pred_sem_seg.data)

    inferencer = MMSegInferencer(model=copy.deepcopy(cfg), weights=ckpt, device='cpu')
    torch.manual_seed(0)
    out = inferencer(img_path, return_datasamples=True)
    _check(out, 150)
    assert torch.equal(out.pred_sem_seg.data, from_file.pred_sem_seg.data)
    for source in (img, img_path):
        torch.manual_seed(0)
        pred = inferencer(source)['predictions']  # the dict API: the class map as an array
        assert pred.shape == (IMG_H, IMG_W)
        assert np.array_equal(pred, from_file.pred_sem_seg.data[0].numpy())


@pytest.mark.parametrize('path', SEG_CONFIGS, ids=config_id)
def test_real_arch_builds_through_init_model(path):
    from mmseg.apis import init_model
    cfg = load(path)
    model = init_model(cfg, device='cpu')
    assert model.backbone.arch_settings['embed_dims'] == model.backbone.embed_dims
    assert sum(p.numel() for p in model.parameters()) > 1e6
