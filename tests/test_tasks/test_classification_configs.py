"""Every classification config builds: model (exact parameter count), pipelines, schedule."""
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from conftest import REPO_ROOT

AUTHORS_PARAMS = dict(b0=7_548_712, b1=9_227_496, b2=16_450_664, b3=27_145_896, b4=49_798_792,
                      b5=97_773_000)
CONFIGS = sorted(glob.glob(osp.join(REPO_ROOT, 'configs', 'classification', 'polapp-b*_in1k.py')))


def build_classifier(cfg):
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS

    import polaformerpp  # noqa: F401
    init_default_scope('mmpretrain')
    model_cfg = cfg.model.copy()
    model_cfg.setdefault('data_preprocessor', cfg.get('data_preprocessor'))  # as the Runner does
    return MODELS.build(model_cfg)


def test_all_six_archs_have_a_config():
    names = {osp.basename(c).split('_')[0] for c in CONFIGS}
    assert names == {f'polapp-b{i}' for i in range(6)}


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_config_builds_with_authors_param_count(path):
    cfg = Config.fromfile(path)
    arch = cfg.model.backbone.arch
    model = build_classifier(cfg)
    assert sum(p.numel() for p in model.parameters()) == AUTHORS_PARAMS[arch]
    # published recipe pieces
    assert cfg.optim_wrapper.optimizer.type == 'AdamW'
    assert cfg.optim_wrapper.clip_grad.max_norm == 5.0
    total_batch = 8 * cfg.train_dataloader.batch_size
    assert cfg.optim_wrapper.optimizer.lr == pytest.approx(5e-4 * total_batch / 512)
    assert cfg.auto_scale_lr.base_batch_size == total_batch
    assert osp.basename(path).startswith(f'polapp-{arch}_8xb{cfg.train_dataloader.batch_size}_')
    assert cfg.train_cfg.max_epochs == 300
    assert cfg.custom_hooks[0].type == 'EMAHook'


def test_pipelines_and_data_preprocessor_run():
    import numpy as np
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import TRANSFORMS
    init_default_scope('mmpretrain')
    cfg = Config.fromfile(CONFIGS[0])
    img = np.random.default_rng(0).integers(0, 255, (300, 260, 3), dtype=np.uint8)
    for pipeline, size in ((cfg.train_pipeline, 224), (cfg.test_pipeline, 224)):
        results = dict(img=img, img_shape=img.shape[:2], ori_shape=img.shape[:2], gt_label=3)
        for t in pipeline[1:]:  # skip LoadImageFromFile
            results = TRANSFORMS.build(t)(results)
        assert tuple(results['inputs'].shape) == (3, size, size)


def test_classifier_forward_loss_and_predict():
    cfg = Config.fromfile(CONFIGS[0])
    model = build_classifier(cfg)
    model.init_weights()
    from mmpretrain.structures import DataSample
    data = dict(inputs=[torch.randint(0, 255, (3, 97, 131), dtype=torch.uint8) for _ in range(2)],
                data_samples=[DataSample().set_gt_label(i) for i in (1, 7)])
    model.train()
    losses = model(**model.data_preprocessor(data, True), mode='loss')
    assert torch.isfinite(losses['loss'])
    model.eval()
    with torch.no_grad():
        preds = model(**model.data_preprocessor(data, False), mode='predict')
    assert preds[0].pred_score.shape == (1000, )
