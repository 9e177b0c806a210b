"""The x2/x3/x4 super-resolution configs hold the authors' recipe and test protocol.

Reference: the authors' release (``ZacharyMeng/PolaFormerPP``,
downstream/sr/options/{train,test}/mambairv2/*_x{3,4}.yml, and the test() of
downstream/sr/basicsr/models/mambairv2light_model.py); x2 has no release
recipe and uses theirs with the scale changed.
"""

import numpy as np
import pytest
from mmengine.config import Config

from recipe_testing import (
    build_model,
    decayed_names,
    images_per_iteration,
    lr_at,
    norm_training_modes,
    optimizer_groups,
)
from sr_testing import (
    SR_CONFIGS,
    one_torch_thread,  # noqa: F401 (fixtures)
)

VAL_SET = {2: 'Set14', 3: 'Set14', 4: 'Set5'}


@pytest.fixture(scope='module')
def configs():
    return {s: Config.fromfile(path) for s, path in SR_CONFIGS.items()}


@pytest.mark.parametrize('scale', [2, 3, 4])
def test_data_and_protocol(configs, scale):
    cfg = configs[scale]
    from mmengine.dataset import Compose
    assert cfg.default_scope is None and cfg.custom_imports.imports == ['polaformerpp.restoration']
    assert images_per_iteration(cfg) == 128  # 16 per GPU x 8 GPUs (yml: batch_size_per_gpu, num_gpu)
    assert cfg.train_dataloader.dataset.scale == scale
    assert cfg.train_dataloader.dataset.lr_dir == 'DIV2K_train_LR_bicubic/X{scale}'
    assert cfg.train_dataloader.sampler == dict(type='InfiniteSampler', shuffle=True)
    # gt_size 192 at every scale, hflip + rot (vflip and transpose)
    pipeline = Compose(cfg.train_pipeline[1:-1])
    sample = pipeline(dict(lr=np.zeros((120, 130, 3), np.uint8), gt=np.zeros((120 * scale, 130 * scale, 3), np.uint8),
                           scale=scale))
    assert sample['gt'].shape == (192, 192, 3) and sample['lr'].shape == (192 // scale, 192 // scale, 3)
    flips = cfg.train_pipeline[2]
    assert (flips.type, flips.hflip, flips.vflip, flips.rot90) == ('PairedFlipRot', True, True, True)
    # test: the LR and GT as read (GT cropped to scale x LR), no resizing or padding of the data
    assert [t.type for t in cfg.test_pipeline] == ['LoadPairedImages', 'PackSRInputs']
    assert cfg.val_dataloader.dataset.pipeline == cfg.test_pipeline
    assert (cfg.val_dataloader.dataset.name, cfg.val_dataloader.dataset.scale) == (VAL_SET[scale], scale)
    tests = cfg.test_dataloader.dataset.datasets
    assert [(d.name, d.scale, d.pipeline) for d in tests] == [
        (n, scale, cfg.test_pipeline) for n in ('Set5', 'Set14', 'B100', 'Urban100', 'Manga109')]
    assert cfg.val_evaluator == [dict(type='PSNR')]  # crop_border = scale, Y channel
    assert cfg.test_evaluator == [dict(type='PSNR'), dict(type='SSIM')]
    assert cfg.model.pad_to_window and cfg.model.tile == dict(split_size=200, overlap_div=10)
    assert cfg.val_dataloader.batch_size == cfg.test_dataloader.batch_size == 1
    assert cfg.train_cfg == dict(type='IterBasedTrainLoop', max_iters=500000, val_interval=5000)
    assert cfg.default_hooks.checkpoint.interval == 5000 and cfg.default_hooks.logger.interval == 200
    assert cfg.randomness == dict(seed=10, diff_rank_seed=True)  # set_random_seed(seed + rank)
    assert cfg.auto_scale_lr.base_batch_size == 128


@pytest.mark.parametrize('scale', [2, 3, 4])
def test_model_and_optimizer(configs, scale):
    cfg = configs[scale]
    model = build_model(cfg)
    assert model.network.upscale == scale and model.pad_multiple == 16
    assert sum(p.numel() for p in model.parameters()) == {2: 923_852, 3: 930_347, 4: 939_440}[scale]
    # fp32 Adam on every parameter, no weight decay, no clipping, no EMA
    assert cfg.optim_wrapper.type == 'OptimWrapper' and 'clip_grad' not in cfg.optim_wrapper
    assert cfg.get('custom_hooks') is None
    groups = optimizer_groups(cfg, model)
    assert len(groups) == 1 and groups[0]['lr'] == 2e-4
    assert sorted(groups[0]['names']) == sorted(n for n, _ in model.named_parameters())
    assert decayed_names(cfg, model) == set()
    assert cfg.optim_wrapper.optimizer == dict(type='Adam', lr=2e-4, betas=(0.9, 0.99), weight_decay=0)
    # LayerNorms only (no running statistics), all in training mode while training
    import torch
    modes = norm_training_modes(model)
    assert modes and all(modes.values())
    assert all(isinstance(model.get_submodule(n), torch.nn.LayerNorm) for n in modes)


def test_schedule_is_the_release_multistep(configs):
    """No warm-up; lr = 2e-4 * 0.5^(milestones passed); basicsr steps it after every iteration."""
    cfg = configs[3]
    for scale in (2, 4):
        assert configs[scale].param_scheduler == configs[3].param_scheduler
    milestones = (250000, 400000, 450000, 475000)

    def release_lr(i):  # 0-based iteration i uses the scheduler stepped i times
        return 2e-4 * 0.5 ** sum(i >= m for m in milestones)

    iterations = [0, 1, 249999, 250000, 399999, 400000, 449999, 450000, 474999, 475000, 499999]
    assert lr_at(cfg, iterations) == pytest.approx([release_lr(i) for i in iterations], rel=1e-12)
