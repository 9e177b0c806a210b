"""The x2/x3/x4 super-resolution configs build for their scale with the published recipe."""
import os.path as osp

import pytest
from mmengine.config import Config

from sr_testing import (
    SR_CONFIGS,
    one_torch_thread,  # noqa: F401 (fixtures)
)


@pytest.mark.parametrize('scale', [2, 3, 4])
def test_configs_build_for_their_scale(scale):
    cfg = Config.fromfile(SR_CONFIGS[scale])
    assert cfg.default_scope is None
    assert cfg.custom_imports.imports == ['polaformerpp.restoration']
    from mmengine.registry import MODELS
    model = MODELS.build(cfg.model)
    assert model.network.upscale == scale
    assert cfg.train_dataloader.dataset.scale == scale and cfg.val_dataloader.dataset.scale == scale
    assert [d.scale for d in cfg.test_dataloader.dataset.datasets] == [scale] * 5
    assert [d.name for d in cfg.test_dataloader.dataset.datasets] == ['Set5', 'Set14', 'B100',
                                                                      'Urban100', 'Manga109']
    assert cfg.train_pipeline[1].lr_patch_size == 64
    assert cfg.optim_wrapper.optimizer == dict(type='Adam', lr=2e-4, betas=(0.9, 0.99), weight_decay=0)
    assert cfg.param_scheduler[0].milestones == [250000, 400000, 450000, 475000]
    assert cfg.param_scheduler[0].gamma == 0.5 and cfg.train_cfg.max_iters == 500000
    assert 2 * cfg.train_dataloader.batch_size == cfg.auto_scale_lr.base_batch_size
    assert osp.basename(SR_CONFIGS[scale]).startswith(
        f'polapp-srlight_x{scale}_2xb{cfg.train_dataloader.batch_size}-500k_div2k-64')
