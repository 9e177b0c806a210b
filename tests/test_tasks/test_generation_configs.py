"""Generation data sets and configs: ClassImageFolder, the published recipes, the demos, metafile."""
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import MODELS

from conftest import REPO_ROOT
from generation_testing import DIGITS_CONFIG, LATENT_CONFIGS, PIXEL_CONFIG, make_shapes32
from polaformerpp.generation import ClassImageFolder, dit_param_count
from recipe_testing import build_model as recipe_model
from recipe_testing import decayed_names, images_per_iteration, lr_at, norm_training_modes, optimizer_groups


@pytest.fixture(scope='module')
def shapes32(tmp_path_factory):
    return make_shapes32(str(tmp_path_factory.mktemp('shapes32')))


def test_class_image_folder(shapes32):
    ds = ClassImageFolder(shapes32, data_prefix='train', ann_file='meta/train.txt',
                          classes='meta/classes.txt', image_size=16, random_flip=True)
    assert len(ds) == 96 and len(ds.metainfo['classes']) == 4
    item = ds[30]
    assert item['inputs'].shape == (3, 16, 16) and item['inputs'].dtype == torch.uint8
    assert item['data_samples']['gt_label'] == 1
    scanned = ClassImageFolder(shapes32, data_prefix='train', image_size=32, indices=10, test_mode=True)
    assert len(scanned) == 10 and scanned.metainfo['classes'] == ['class0', 'class1', 'class2', 'class3']
    with pytest.raises(FileNotFoundError, match='image folder'):
        ClassImageFolder(shapes32, data_prefix='nope')
    with pytest.raises(FileNotFoundError, match='ann_file'):
        ClassImageFolder(shapes32, data_prefix='train', ann_file='meta/missing.txt')


def test_latent_configs():
    base = Config.fromfile(LATENT_CONFIGS['s'])
    assert base.custom_imports['imports'] == ['polaformerpp.generation']
    for size, path in LATENT_CONFIGS.items():
        cfg = Config.fromfile(path)
        name = f'DiT-{size.upper()}/2'
        assert cfg.model.dit.type == name and cfg.model.dit.attn_type == 'linear'
        with torch.device('meta'):
            net = MODELS.build(cfg.model.dit)
        assert net.input_size == (32, 32) and net.in_channels == 4 and net.num_classes == 1000
    model = MODELS.build(base.model)  # builds without the VAE weights (they load on first use)
    with pytest.raises(FileNotFoundError, match='sd-vae-ft-ema'):
        model.encode(torch.zeros(1, 3, 256, 256))  # no VAE weights on this machine: a clear error


# --------------------------------------------------- the authors' recipe (downstream/dit)
IMAGENET_TRAIN_IMAGES = 1_281_167
EPOCHS = dict(s=100, b=90, l=90, xl=90)  # run-s.sh:6, run-b.sh:6, run-l.sh:6 (XL: no script)


def _published(size):
    cfg = Config.fromfile(LATENT_CONFIGS[size])
    with torch.device('meta'):  # the real network, without its memory
        model = recipe_model(cfg)
    return cfg, model


@pytest.mark.parametrize('size', list(LATENT_CONFIGS))
def test_published_recipe_length_batch_and_optimizer(size):
    from mmengine.optim import build_optim_wrapper
    cfg, model = _published(size)
    # global batch 256 = 8 GPUs x 32 (run-*.sh --global-batch-size 256, torchrun 8 processes)
    assert images_per_iteration(cfg) == 256
    # DistributedSampler pads to 8 x 160,146, the loader drops the last partial batch: 5,004 per epoch
    iters_per_epoch = -(-IMAGENET_TRAIN_IMAGES // 8) // 32
    assert iters_per_epoch == IMAGENET_TRAIN_IMAGES // 256 == 5004
    assert cfg.train_cfg.type == 'EpochBasedTrainLoop' and cfg.train_cfg.max_epochs == EPOCHS[size]
    assert cfg.train_dataloader.drop_last and cfg.train_dataloader.sampler == dict(
        type='DefaultSampler', shuffle=True, seed=0)
    # train.py saves every 10,000 steps; gen.sh samples B/2's 450,000-step checkpoint
    checkpoint = cfg.default_hooks.checkpoint
    assert checkpoint.by_epoch is False and checkpoint.interval == 10_000
    assert (EPOCHS[size] * iters_per_epoch) // 10_000 * 10_000 == (500_000 if size == 's' else 450_000)
    # AdamW(lr=1e-4, weight_decay=0), default betas / eps, on every parameter; constant lr (train.py:155)
    assert decayed_names(cfg, model) == set()
    groups = optimizer_groups(cfg, model)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {n for g in groups for n in g['names']} == trained and all(g['lr'] == 1e-4 for g in groups)
    optimizer = build_optim_wrapper(model, cfg.optim_wrapper).optimizer
    assert type(optimizer).__name__ == 'AdamW'
    assert optimizer.defaults['betas'] == (0.9, 0.999) and optimizer.defaults['eps'] == 1e-8
    iterations = [0, 1, 5003, 5004, 250_000, EPOCHS[size] * iters_per_epoch - 1]
    assert lr_at(cfg, iterations, epoch_length=iters_per_epoch) == [1e-4] * len(iterations)  # lr(t) = 1e-4
    # fp32 (no AMP, no loss scaling), no clipping; TF32 matmuls and cuDNN (train.py:12-13)
    assert cfg.optim_wrapper.type == 'OptimWrapper' and cfg.optim_wrapper.get('clip_grad') is None
    assert cfg.model.allow_tf32 is True
    # EMA 0.9999 after every step from the first, parameters only (train.py:40-49, 184, 211)
    ema, = [h for h in cfg.custom_hooks if h.type == 'EMAHook']
    assert ema.momentum == 1e-4 and ema.get('interval', 1) == 1 and ema.get('begin_iter', 0) == 0
    assert ema.ema_type == 'ExponentialMovingAverage' and ema.update_buffers is False
    # seeds: global_seed * world_size + rank (train.py:121), model init from rank 0's seed 0
    assert cfg.randomness.seed == 0 and cfg.randomness.diff_rank_seed is True


@pytest.mark.parametrize('size', ['s'])
def test_published_data_model_and_norms(size):
    cfg, _ = _published(size)
    model = recipe_model(cfg)
    # ADM centre crop at 256 + horizontal flip, [-1, 1] (train.py:158-163)
    train = cfg.train_dataloader.dataset
    assert train.type == 'ClassImageFolder' and train.image_size == 256 and train.random_flip is True
    # SD-VAE ft-EMA, posterior samples x 0.18215 (train.py:151, 203); 1000 linear steps, learned sigma
    assert model.vae.path == 'data/sd-vae-ft-ema' and model.vae.scale_factor == 0.18215
    assert model.vae.sample_posterior is True
    assert model.diffusion.num_timesteps == 1000 and model.dit.learn_sigma
    assert model.dit.y_embedder.dropout_prob == 0.1 and model.dit.label_embed_std == 0.02
    # LayerNorms (no affine) in training mode while training (train.py:185)
    modes = norm_training_modes(model)
    assert modes and all(modes.values())


def test_published_sampling_and_fid_protocol():
    from mmengine.registry import DATASETS
    for path in LATENT_CONFIGS.values():
        cfg = Config.fromfile(path)
        # gen.sh: 250 respaced DDPM steps, cfg-scale 1.0, x0 not clipped; guidance on 3 channels (models.py)
        assert cfg.model.sample_cfg == dict(num_steps=250, sampler='ddpm', cfg_scale=1.0, cfg_channels=3)
        # 50,000 uniformly random labels, 32 per GPU (sample_ddp.py), against ADM's reference batch
        assert cfg.test_dataloader.batch_size == 32
        assert cfg.test_dataloader.dataset == dict(type='RandomClassLabels', num_samples=50_000,
                                                   num_classes=1000, seed=0)
        assert cfg.test_evaluator.reference.endswith('VIRTUAL_imagenet256_labeled.npz')
    model = recipe_model(Config.fromfile(LATENT_CONFIGS['s']))
    assert model.sample_cfg['clip_denoised'] is False and model.sample_cfg['eta'] == 0.0
    labels = DATASETS.build(cfg.test_dataloader.dataset)
    assert len(labels) == 50_000 and labels[7] == dict(data_samples=dict(gt_label=int(labels.labels[7])))
    counts = np.bincount(labels.labels, minlength=1000)
    assert counts.shape == (1000, ) and 20 < counts.min() and counts.max() < 90  # iid uniform, not balanced
    batch = model.data_preprocessor(dict(data_samples=dict(gt_label=[3, 5])))
    assert batch['inputs'] is None and batch['data_samples']['labels'].tolist() == [3, 5]


def test_metafile_lists_the_configs_with_their_parameter_counts():
    import yaml
    with open(osp.join(REPO_ROOT, 'configs/generation/metafile.yml')) as f:
        models = {m['Name']: m for m in yaml.safe_load(f)['Models']}
    for size, path in LATENT_CONFIGS.items():
        entry = models[osp.splitext(osp.basename(path))[0]]
        assert entry['Config'] == path
        assert entry['Metadata']['Parameters'] == dit_param_count(f'DiT-{size.upper()}/2',
                                                                  attn_type='linear')
    for path in (PIXEL_CONFIG, DIGITS_CONFIG):
        assert models[osp.splitext(osp.basename(path))[0]]['Config'] == path


def test_pixel_config_builds():
    cfg = Config.fromfile(PIXEL_CONFIG)
    model = MODELS.build(cfg.model)
    assert model.space == 'pixel' and model.dit.in_channels == 3 and model.vae is None
    assert cfg.val_evaluator.type == 'GenerationFID'
    # the demos' label table starts at N(0, 1); the published configs keep DiT's N(0, 0.02)
    assert model.dit.label_embed_std == 1.0
    assert 'label_embed_std' not in Config.fromfile(LATENT_CONFIGS['s']).model.dit


def test_digits_config_reads_the_digits_at_16_pixels():
    cfg = Config.fromfile(DIGITS_CONFIG)
    model = MODELS.build(cfg.model)
    assert model.dit.num_classes == 10 and model.dit.input_size == (16, 16) and model.dit.label_embed_std == 1.0
    for loader in (cfg.train_dataloader, cfg.val_dataloader, cfg.test_dataloader):
        assert loader.dataset.image_size == 16 and loader.dataset.data_root == 'data/demo_digits32'
    assert cfg.train_dataloader.dataset.random_flip is False

