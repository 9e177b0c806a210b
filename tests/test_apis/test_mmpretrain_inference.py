"""mmpretrain's own inference APIs on the classification configs: ``get_model`` with a
config path, ``ImageClassificationInferencer``, ``FeatureExtractor``, and the published
names through mmpretrain's model hub, which ``import polaformerpp`` fills."""
import copy
import json
import os
import os.path as osp
import subprocess
import sys

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


def published_names():
    """The model names of the classification metafile (sorted)."""
    import yaml
    with open(osp.join(REPO_ROOT, 'configs', 'classification', 'metafile.yml')) as f:
        return sorted(m['Name'] for m in yaml.safe_load(f)['Models'])


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

    assert register_mmpretrain_models() == []  # `import polaformerpp` registered them already
    assert sorted(mmpretrain.list_models('polapp*')) == published_names()
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


# A fresh interpreter, as a user starts one: polaformerpp first (it must not import mmpretrain),
# then mmpretrain's own calls by name.
BY_NAME_SCRIPT = """
import copy, json, sys
import polaformerpp
assert 'mmpretrain' not in sys.modules, 'import polaformerpp imported mmpretrain'
import mmpretrain
names = sorted(mmpretrain.list_models('polapp*'))
model = mmpretrain.get_model('polapp-b0_8xb256_in1k', pretrained=CKPT, device='cpu', **copy.deepcopy(TINY))
inferencer = mmpretrain.ImageClassificationInferencer('polapp-b0_8xb256_in1k', pretrained=CKPT, device='cpu',
                                                      **copy.deepcopy(TINY))
result = inferencer(IMG)[0]
with open(OUT, 'w') as f:
    json.dump(dict(names=names, scores=result['pred_scores'].tolist(), pred_class=result['pred_class'],
                   fc=model.head.fc.weight.sum().item(), config=model._config.filename), f)
"""


def test_published_names_resolve_through_mmpretrains_hub_after_import(tmp_path):
    import mmcv
    from mmpretrain import ImageClassificationInferencer, get_model
    path = f'{REPO_ROOT}/{MAIN_CONFIG}'
    classes = tuple(f'c{i}' for i in range(1000))
    reference = perturb(get_model(path, **copy.deepcopy(TINY)))
    ckpt = save_weights(reference, tmp_path / 'tiny_b0.pth', dataset_meta=dict(classes=classes))
    img = str(tmp_path / 'astronaut.png')
    mmcv.imwrite(astronaut_bgr(), img)
    model = get_model(path, pretrained=ckpt, device='cpu', **copy.deepcopy(TINY))
    expected = ImageClassificationInferencer(model)(img)[0]

    out_file = tmp_path / 'by_name.json'
    script = f'CKPT, IMG, TINY, OUT = {ckpt!r}, {img!r}, {TINY!r}, {str(out_file)!r}\n' + BY_NAME_SCRIPT
    proc = subprocess.run([sys.executable, '-c', script], cwd=str(tmp_path), capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, OMP_NUM_THREADS='1'))
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(out_file.read_text())
    assert out['names'] == published_names()
    assert osp.basename(out['config']) == osp.basename(MAIN_CONFIG)  # the name's config, from the metafile
    assert out['fc'] == pytest.approx(reference.head.fc.weight.sum().item(), rel=1e-6)  # the checkpoint loaded
    np.testing.assert_allclose(out['scores'], expected['pred_scores'], rtol=1e-5, atol=1e-7)
    assert out['pred_class'] == expected['pred_class'] == classes[int(np.argmax(expected['pred_scores']))]


def test_call_after_import_runs_after_the_module_and_once(tmp_path, monkeypatch):
    from polaformerpp.utils.import_hooks import call_after_import
    package = tmp_path / 'polapp_hook_probe'
    package.mkdir()
    (package / '__init__.py').write_text('')
    (package / 'hub.py').write_text('MODELS = {}\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

    def register(module):
        module.MODELS['x'] = 1  # the module's code has run
        seen.append(module.__name__)

    finders = list(sys.meta_path)
    try:
        call_after_import('polapp_hook_probe.hub', register)
        assert seen == [] and 'polapp_hook_probe.hub' not in sys.modules  # nothing imported by the call
        import polapp_hook_probe.hub as hub
        assert seen == ['polapp_hook_probe.hub'] and hub.MODELS == {'x': 1}
        assert sys.meta_path == finders  # the hook removed itself
        call_after_import('polapp_hook_probe.hub', register)  # imported already: called at once
        assert seen == ['polapp_hook_probe.hub'] * 2
        import importlib
        importlib.reload(hub)  # the hook was used once
        assert len(seen) == 2 and hub.MODELS == {}
    finally:
        sys.meta_path[:] = finders
        for name in ('polapp_hook_probe.hub', 'polapp_hook_probe'):
            sys.modules.pop(name, None)
    with pytest.raises(ValueError, match='expected a module name'):
        call_after_import('', register)
