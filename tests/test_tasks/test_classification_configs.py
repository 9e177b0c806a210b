"""Every classification config builds (exact parameter count) and holds the authors' recipe."""
import glob
import math
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from conftest import REPO_ROOT
from recipe_testing import build_model, decayed_names, images_per_iteration, lr_at, norm_training_modes

AUTHORS_PARAMS = dict(b0=7_548_712, b1=9_227_496, b2=16_450_664, b3=27_145_896, b4=49_798_792,
                      b5=97_773_000)
CONFIGS = sorted(glob.glob(osp.join(REPO_ROOT, 'configs', 'classification', 'polapp-b*_in1k.py')))
# the authors' recipe: images per optimizer step, and the final lr per 512 images
IMAGES = dict(b0=2048, b1=2048, b2=2048, b3=1024, b4=1024, b5=1024)
MIN_LR = dict(b0=1e-7, b1=1e-7, b2=1e-7, b3=1e-7, b4=5e-6, b5=5e-6)


def authors_decays(name, param):
    """The authors' rule on their shapes: no decay for 1-D tensors and biases.

    Our layer scales ``gamma1/2`` are (C,); theirs are (1, C, 1, 1), hence decayed.
    """
    authors_ndim = 4 if name.endswith(('.gamma1', '.gamma2')) else param.ndim
    return authors_ndim > 1 and not name.endswith('.bias')


def test_all_six_archs_have_a_config():
    names = {osp.basename(c).split('_')[0] for c in CONFIGS}
    assert names == {f'polapp-b{i}' for i in range(6)}


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_config_builds_with_authors_param_count(path):
    cfg = Config.fromfile(path)
    arch = cfg.model.backbone.arch
    model = build_model(cfg)
    assert sum(p.numel() for p in model.parameters()) == AUTHORS_PARAMS[arch]
    # published recipe pieces
    assert cfg.optim_wrapper.optimizer.type == 'AdamW'
    assert cfg.optim_wrapper.clip_grad.max_norm == 5.0
    total_batch = images_per_iteration(cfg)
    assert total_batch == IMAGES[arch]
    assert cfg.optim_wrapper.optimizer.lr == pytest.approx(5e-4 * total_batch / 512)
    assert cfg.optim_wrapper.optimizer.weight_decay == 0.05
    assert cfg.auto_scale_lr.base_batch_size == total_batch
    assert cfg.train_cfg.max_epochs == 300
    assert cfg.train_dataloader.drop_last is True
    ema = cfg.custom_hooks[0]
    assert ema.type == 'EMAHook' and ema.momentum == pytest.approx(1 - 0.99982) and ema.update_buffers
    assert cfg.get('optim_wrapper').get('type', 'OptimWrapper') == 'OptimWrapper'  # fp32, as theirs
    assert cfg.randomness.seed == 0 and cfg.randomness.diff_rank_seed  # seed 0 + rank
    # weight decay on exactly the tensors the authors' optimizer decays
    expected = {n for n, p in model.named_parameters() if authors_decays(n, p)}
    assert decayed_names(cfg, model) == expected
    assert {'backbone.stages.0.blocks.0.gamma1', 'backbone.stages.0.blocks.0.attn.temp_same'} <= expected
    # every norm layer (BatchNorm of stem, downsampling and projection; LayerNorm) trains
    modes = norm_training_modes(model)
    assert modes and all(modes.values())


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_lr_follows_the_authors_schedule(path):
    cfg = Config.fromfile(path)
    arch = cfg.model.backbone.arch
    epoch, warmup, total = 10, 20 * 10, 300 * 10  # 10 iterations per epoch
    base = 5e-4 * IMAGES[arch] / 512
    warm, low = 5e-7 * IMAGES[arch] / 512, MIN_LR[arch] * IMAGES[arch] / 512

    def authors(t):  # timm's CosineLRScheduler, no warm-up prefix: one cosine over all steps,
        if t < warmup:  # its first `warmup` steps replaced by the linear warm-up from `warm`
            return warm + (base - warm) * t / warmup
        return low + (base - low) * 0.5 * (1 + math.cos(math.pi * t / total))

    steps = [0, 1, 57, warmup - 1, warmup, warmup + 1, 1234, total // 2, total - 1]
    ours = lr_at(cfg, steps, epoch_length=epoch)
    assert ours == pytest.approx([authors(t) for t in steps], rel=1e-9)


def test_test_transform_is_square_resize_then_centre_crop():
    cfg = Config.fromfile(CONFIGS[0])
    load, resize, crop, pack = cfg.test_pipeline
    assert load == dict(type='LoadImageFromFile', imdecode_backend='pillow', color_type='color_ignore_orientation')
    assert resize == dict(type='Resize', scale=(256, 256), keep_ratio=False, backend='pillow',
                          interpolation='bicubic')
    assert crop == dict(type='CenterCrop', crop_size=224) and pack.type == 'PackInputs'
    assert cfg.train_pipeline[0] == load
    for path in CONFIGS[1:]:
        assert Config.fromfile(path).test_pipeline == cfg.test_pipeline


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
    # the test transform is PIL's bicubic resize to 256 x 256, then the central 224 x 224
    from PIL import Image
    expected = np.asarray(Image.fromarray(img[..., ::-1]).resize((256, 256), Image.BICUBIC))[16:240, 16:240]
    assert np.array_equal(results['inputs'].numpy().transpose(1, 2, 0)[..., ::-1], expected)


def test_classifier_forward_loss_and_predict():
    cfg = Config.fromfile(CONFIGS[0])
    model = build_model(cfg)
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
