"""Generation data set and configs: ClassImageFolder, latent and pixel configs, metafile."""
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import MODELS

from conftest import REPO_ROOT
from generation_testing import DIGITS_CONFIG, LATENT_CONFIGS, PIXEL_CONFIG, make_shapes32
from polaformerpp.generation import ClassImageFolder, dit_param_count


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
    assert base.train_dataloader.batch_size == 32 and base.train_cfg.max_iters == 400_000
    assert base.optim_wrapper.optimizer == dict(type='AdamW', lr=1e-4, weight_decay=0.0)
    assert base.custom_hooks[0].type == 'EMAHook' and base.custom_hooks[0].momentum == 1e-4
    assert base.model.space == 'latent' and base.model.vae.scale_factor == 0.18215
    assert base.model.sample_cfg.num_steps == 250
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

