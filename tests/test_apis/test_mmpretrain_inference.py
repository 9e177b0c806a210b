"""mmpretrain's own inference APIs on the classification configs: ``get_model`` with a
config path, ``ImageClassificationInferencer``, ``FeatureExtractor``, and ``inference_model``
by name after ``polaformerpp.apis.register_mmpretrain_models``."""
import copy

import numpy as np
import pytest
import torch

from apis_testing import (
    TINY_ARCH,
    astronaut_bgr,
    config_id,
    configs_of,
    one_thread,  # noqa: F401 (fixture)
    perturb,
    save_weights,
)
from conftest import REPO_ROOT

CLS_CONFIGS = configs_of('classification')
MAIN_CONFIG = 'configs/classification/polapp-b0_8xb256_in1k.py'
TINY = dict(backbone=dict(arch=dict(TINY_ARCH, cls_proj_channels=64, _delete_=True), drop_path_rate=0.0),
            head=dict(in_channels=64))


@pytest.fixture(autouse=True)
def mmpretrain_scope():
    """mmpretrain's inferencers build their pipeline in the current default scope, which
    mmdet's and mmseg's init functions (run earlier in this process) set to their own."""
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        yield


def _check_scores(result, num_classes):
    scores = result['pred_scores']
    assert scores.shape == (num_classes, ) and (scores >= 0).all()
    assert abs(float(scores.sum()) - 1) < 1e-4  # softmax over the classes
    assert result['pred_label'] == int(np.argmax(scores)) and 0 <= result['pred_label'] < num_classes
    assert result['pred_score'] == pytest.approx(float(scores.max()))


@pytest.mark.parametrize('path', CLS_CONFIGS, ids=config_id)
def test_get_model_from_config_path_and_inferencer(path):
    from mmpretrain import ImageClassificationInferencer, get_model
    model = get_model(f'{REPO_ROOT}/{path}', device='cpu', **copy.deepcopy(TINY))
    assert not model.training
    num_classes = model.head.num_classes
    inferencer = ImageClassificationInferencer(model, device='cpu')
    result = inferencer(astronaut_bgr())[0]  # a BGR array, as mmcv.imread gives
    _check_scores(result, num_classes)
    if num_classes == 1000:
        assert isinstance(result['pred_class'], str)  # ImageNet's class names from the dataset


def test_checkpoint_inferencer_feature_extractor_and_inference_model_by_name(tmp_path):
    import mmcv
    import mmpretrain
    from mmpretrain import FeatureExtractor, ImageClassificationInferencer, get_model, inference_model

    from polaformerpp.apis import register_mmpretrain_models
    path = f'{REPO_ROOT}/{MAIN_CONFIG}'
    classes = tuple(f'c{i}' for i in range(1000))
    ckpt = save_weights(perturb(get_model(path, **copy.deepcopy(TINY))), tmp_path / 'cls.pth',
                        dataset_meta=dict(classes=classes))
    img = astronaut_bgr()
    img_path = str(tmp_path / 'astronaut.png')
    mmcv.imwrite(img, img_path)

    model = get_model(path, pretrained=ckpt, device='cpu', **copy.deepcopy(TINY))
    by_path = ImageClassificationInferencer(model)([img_path, img])
    for result in by_path:
        _check_scores(result, 1000)
        assert result['pred_class'] == classes[result['pred_label']]
    np.testing.assert_allclose(by_path[0]['pred_scores'], by_path[1]['pred_scores'], rtol=1e-5, atol=1e-7)

    features = FeatureExtractor(model)(img)[0]  # the backbone's classification projection (index 4)
    assert isinstance(features, tuple) and len(features) == 1
    assert features[0].shape == (64, )  # globally pooled: cls_proj_channels of the tiny arch

    names = register_mmpretrain_models()
    assert 'polapp-b0_8xb256_in1k' in names and len(names) == len(CLS_CONFIGS) - 1  # not the demo
    assert register_mmpretrain_models() == []  # idempotent
    assert 'polapp-b5_8xb128_in1k' in mmpretrain.list_models('polapp*')
    named = get_model('polapp-b0_8xb256_in1k', pretrained=ckpt, device='cpu', **copy.deepcopy(TINY))
    result = inference_model(named, img_path)
    _check_scores(result, 1000)
    np.testing.assert_allclose(result['pred_scores'], by_path[0]['pred_scores'], rtol=1e-5, atol=1e-7)
    assert torch.equal(named.state_dict()['head.fc.weight'], model.state_dict()['head.fc.weight'])


@pytest.mark.parametrize('path', CLS_CONFIGS, ids=config_id)
def test_real_arch_get_model_and_inference(path):
    from mmpretrain import ImageClassificationInferencer, get_model
    model = get_model(f'{REPO_ROOT}/{path}', device='cpu')
    _check_scores(ImageClassificationInferencer(model)(astronaut_bgr())[0], model.head.num_classes)
