"""Every classification config builds (exact parameter count) and follows the authors' files item by item.

The authors' values are transcribed below from their release (``polaformer++/``:
``cfgs/pola_b*.yaml`` over ``config.py``'s defaults, ``pretrain.sh``'s 8 GPUs), and
their learning rate from the formula of timm's ``CosineLRScheduler`` as their
``lr_scheduler.py`` builds it and ``main_ema.py`` steps it, written out here. Our side
is read from what mmengine builds from each config.
"""
import glob
import math
import os.path as osp

import pytest
import torch
import yaml
from mmengine.config import Config

from conftest import REPO_ROOT
from polaformerpp.engine import accumulated
from recipe_testing import (
    build_model,
    decayed_names,
    images_per_iteration,
    lr_at,
    norm_training_modes,
    optim_wrapper,
)

AUTHORS_PARAMS = dict(b0=7_548_712, b1=9_227_496, b2=16_450_664, b3=27_145_896, b4=49_798_792,
                      b5=97_773_000)
GPUS = 8  # pretrain.sh
#: config.py's defaults; lr values per 512 images (main_ema.py scales them by GPUs x batch / 512)
DEFAULTS = dict(batch=128, base_lr=5e-4, warmup_lr=5e-7, min_lr=5e-6, epochs=300, warmup=20, cooldown=0,
                clip=5.0, weight_decay=0.05)
#: what each cfgs/pola_b<i>.yaml overrides
AUTHORS = dict(
    b0=dict(DEFAULTS, batch=256, min_lr=1e-7),
    b1=dict(DEFAULTS, batch=256, min_lr=1e-7),
    b2=dict(DEFAULTS, batch=256, min_lr=1e-7),
    b3=dict(DEFAULTS, batch=128, min_lr=1e-7),
    b4=dict(DEFAULTS, weight_decay=0.05, warmup=5, cooldown=10, base_lr=5e-4, warmup_lr=1e-7, min_lr=1e-5,
            clip=1.0),
    b5=dict(DEFAULTS, weight_decay=1e-8, warmup=1, cooldown=5, base_lr=2e-5, min_lr=5e-6, clip=None, batch=64),
)
DROP_PATH = dict(b0=0.1, b1=0.1, b2=0.1, b3=0.15, b4=0.4, b5=0.55)  # models/pola.py, per arch function
EMA_DECAY = 0.99982  # pretrain.sh

CLS_DIR = osp.join(REPO_ROOT, 'configs', 'classification')
CONFIGS = sorted(glob.glob(osp.join(CLS_DIR, 'polapp-b*_in1k.py')))
with open(osp.join(CLS_DIR, 'metafile.yml')) as f:
    PUBLISHED = {m['Name']: osp.join(REPO_ROOT, m['Config']) for m in yaml.safe_load(f)['Models']}
#: the configs beyond the published ones, and whose recipe each follows
VARIANTS = {osp.join(CLS_DIR, 'polapp-b5_8xb128-b4recipe_in1k.py'): 'b4'}


def recipe_of(path, arch):
    """The authors' recipe a config follows: its arch's, or the one a variant names."""
    return AUTHORS[VARIANTS.get(path, arch)]


def test_every_config_is_published_or_a_named_variant():
    assert set(CONFIGS) == set(PUBLISHED.values()) | set(VARIANTS)
    assert {Config.fromfile(p).model.backbone.arch for p in PUBLISHED.values()} == set(AUTHORS)
    for name, path in PUBLISHED.items():  # model name = file name
        assert osp.basename(path) == name + '.py'


_LAST_MODEL = {}


def model_of(cfg):
    """The built model; the last one is kept for the next config if that has the same model (b5's two)."""
    key = repr((cfg.default_scope, cfg.model.to_dict()))
    if key not in _LAST_MODEL:
        _LAST_MODEL.clear()
        _LAST_MODEL[key] = build_model(cfg)
    return _LAST_MODEL[key]


def authors_decays(name, param):
    """The authors' rule on their shapes: no decay for 1-D tensors and biases (optimizer.py:55).

    Our layer scales ``gamma1/2`` are (C,); theirs are (1, C, 1, 1), hence decayed.
    """
    authors_ndim = 4 if name.endswith(('.gamma1', '.gamma2')) else param.ndim
    return authors_ndim > 1 and not name.endswith('.bias')


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_config_builds_and_follows_the_authors_files(path):
    cfg = Config.fromfile(path)
    arch = cfg.model.backbone.arch
    recipe = recipe_of(path, arch)
    model = model_of(cfg)
    assert sum(p.numel() for p in model.parameters()) == AUTHORS_PARAMS[arch]
    drop_probs = [m.drop_prob for m in model.modules() if hasattr(m, 'drop_prob')]
    assert drop_probs == pytest.approx(torch.linspace(0, DROP_PATH[arch], len(drop_probs)).tolist())

    # images per step, and the lr of every parameter group scaled from per-512 as main_ema.py does
    total_batch = images_per_iteration(cfg)
    assert total_batch == GPUS * recipe['batch']
    assert cfg.auto_scale_lr.base_batch_size == total_batch
    wrapper = optim_wrapper(cfg, model)
    assert type(wrapper).__name__ == 'OptimWrapper'  # fp32, as theirs
    optimizer = wrapper.optimizer
    assert type(optimizer) is torch.optim.AdamW
    assert optimizer.defaults['betas'] == (0.9, 0.999) and optimizer.defaults['eps'] == 1e-8
    for group in optimizer.param_groups:
        assert group['lr'] == pytest.approx(recipe['base_lr'] * total_batch / 512, rel=1e-12)
        assert group['weight_decay'] in (0.0, pytest.approx(recipe['weight_decay'], rel=1e-12))
    clip = cfg.optim_wrapper.get('clip_grad')
    assert (clip and clip['max_norm']) == recipe['clip'] if recipe['clip'] else clip is None
    # weight decay on exactly the tensors the authors' optimizer decays
    expected = {n for n, p in model.named_parameters() if authors_decays(n, p)}
    assert decayed_names(cfg, model) == expected
    assert {'backbone.stages.0.blocks.0.gamma1', 'backbone.stages.0.blocks.0.attn.temp_same'} <= expected

    # cosine epochs + cool-down epochs, EMA after every step on weights and buffers, seed 0 + rank
    assert cfg.train_cfg.max_epochs == recipe['epochs'] + recipe['cooldown']
    ema, = [h for h in cfg.custom_hooks if h.type == 'EMAHook']
    assert ema.momentum == pytest.approx(1 - EMA_DECAY) and ema.update_buffers
    assert ema.get('interval', 1) == 1 and not ema.get('begin_iter') and not ema.get('begin_epoch')
    assert cfg.randomness.seed == 0 and cfg.randomness.diff_rank_seed
    assert cfg.env_cfg.cudnn_benchmark
    assert cfg.train_dataloader.drop_last is True
    # every norm layer (BatchNorm of stem, downsampling and projection; LayerNorm) trains
    modes = norm_training_modes(model)
    assert modes and all(modes.values())


def timm_cosine(t, base, lr_min, warmup_lr_init, warmup_t, t_initial):
    """timm's ``CosineLRScheduler(t_initial, lr_min, warmup_lr_init, warmup_t, cycle_limit=1)`` at update
    ``t``: no warm-up prefix (the cosine counts from 0), ``lr_min`` once the first cycle is over."""
    if t < warmup_t:
        return warmup_lr_init + t * (base - warmup_lr_init) / warmup_t
    cycle = t // t_initial
    if cycle >= 1:  # cycle_limit=1
        return lr_min
    return lr_min + 0.5 * (base - lr_min) * (1 + math.cos(math.pi * (t - cycle * t_initial) / t_initial))


def authors_lrs(recipe, steps_per_epoch):
    """The lr each optimizer step of the authors' run trains with (main_ema.py's loop)."""
    scale = GPUS * recipe['batch'] / 512  # main_ema.py:91-93
    base, warm, low = (recipe[k] * scale for k in ('base_lr', 'warmup_lr', 'min_lr'))
    t_initial, warmup_t = recipe['epochs'] * steps_per_epoch, recipe['warmup'] * steps_per_epoch

    def value(t):
        return timm_cosine(t, base, low, warm, warmup_t, t_initial)

    lr = warm if warmup_t else base  # what the scheduler sets when it is built
    used = []
    for epoch in range(recipe['epochs'] + recipe['cooldown']):
        for idx in range(steps_per_epoch):
            used.append(lr)  # optimizer.step()
            lr = value(epoch * steps_per_epoch + idx)  # lr_scheduler.step_update(...) after it
    return used


STEPS_PER_EPOCH = 3


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_lr_of_every_step_is_the_authors(path):
    """A whole run of the config's schedule (3 steps per epoch), step by step."""
    cfg = Config.fromfile(path)
    expected = authors_lrs(recipe_of(path, cfg.model.backbone.arch), STEPS_PER_EPOCH)
    ours = lr_at(cfg, range(len(expected)), epoch_length=STEPS_PER_EPOCH)
    assert ours == pytest.approx(expected, rel=1e-9, abs=0)


@pytest.mark.parametrize('n', [2, 3])
@pytest.mark.parametrize('name', ['polapp-b0_8xb256_in1k', 'polapp-b4_8xb128_in1k', 'polapp-b5_8xb64_in1k'])
def test_lr_of_every_step_is_the_authors_with_accumulation(name, n):
    """``--accumulate n``: each epoch holds n times the iterations, one optimizer step per n; the step made
    on iteration n*s + n - 1 trains with the authors' lr of step s, and the lr changes only between steps."""
    cfg = Config.fromfile(PUBLISHED[name])
    expected = authors_lrs(AUTHORS[cfg.model.backbone.arch], STEPS_PER_EPOCH)
    acc = accumulated(cfg, n)
    assert acc.optim_wrapper.accumulative_counts == n and acc.param_scheduler[0].accumulative_counts == n
    ours = lr_at(acc, range(n * len(expected)), epoch_length=n * STEPS_PER_EPOCH)
    assert ours[n - 1::n] == pytest.approx(expected, rel=1e-9, abs=0)
    for s in range(len(expected)):
        assert len(set(ours[n * s:n * s + n])) == 1, s


def test_schedule_values_resolved():
    """b4's values as numbers (8 x 128 images: twice the per-512 ones), 2 steps per epoch: warm-up over
    10 steps from 2e-7 to 1e-3, cosine over 600 steps to 2e-5, 20 cool-down steps at 2e-5."""
    cfg = Config.fromfile(PUBLISHED['polapp-b4_8xb128_in1k'])
    lrs = lr_at(cfg, [0, 1, 2, 10, 11, 600, 601, 619], epoch_length=2)
    warm = [2e-7 + t * (1e-3 - 2e-7) / 10 for t in (0, 0, 1, 9)]  # step s trains with the value of s - 1
    cosine = [2e-5 + (1e-3 - 2e-5) * 0.5 * (1 + math.cos(math.pi * t / 600)) for t in (10, 599)]
    assert lrs == pytest.approx(warm + cosine[:1] + cosine[1:] + [2e-5, 2e-5], rel=1e-9)
    assert cosine[0] < warm[-1] + (1e-3 - 2e-7) / 10  # the lr drops where the warm-up meets the cosine


def test_test_transform_is_square_resize_then_centre_crop():
    cfg = Config.fromfile(CONFIGS[0])
    load, resize, crop, pack = cfg.test_pipeline
    assert load == dict(type='LoadImageFromFile', imdecode_backend='pillow', color_type='color_ignore_orientation')
    assert resize == dict(type='Resize', scale=(256, 256), keep_ratio=False, backend='pillow',
                          interpolation='bicubic')
    assert crop == dict(type='CenterCrop', crop_size=224) and pack.type == 'PackInputs'
    assert cfg.train_pipeline[0] == load
    for path in CONFIGS[1:]:
        other = Config.fromfile(path)
        assert other.test_pipeline == cfg.test_pipeline and other.train_pipeline == cfg.train_pipeline


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
