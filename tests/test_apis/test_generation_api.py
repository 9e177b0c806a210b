"""polaformerpp.apis for generation: init_generator + sample_images."""
import numpy as np
import pytest
import torch

from apis_testing import config_id, configs_of, one_thread, perturb, save_weights  # noqa: F401 (fixture)
from polaformerpp.apis import init_generator, sample_images
from polaformerpp.generation import DiTDiffusion

PIXEL_CONFIG = 'configs/generation/dit-tiny-4_polapp_1xb32-2k_demo-shapes-32.py'
LATENT_CONFIGS = [p for p in configs_of('generation') if '_demo-' not in p]  # the CPU demos are pixel space


def test_sample_images_shape_range_and_seeds(tmp_path):
    model = init_generator(PIXEL_CONFIG)
    assert isinstance(model, DiTDiffusion) and not model.training and model.cfg.model.space == 'pixel'
    perturb(model.dit, seed=2, scale=0.02)
    images = sample_images(model, [0, 1, 3], num_steps=2, seed=0)
    assert images.shape == (3, 32, 32, 3) and images.dtype == np.uint8  # (B, H, W, 3) RGB
    assert images.std() > 0
    np.testing.assert_array_equal(images, sample_images(model, np.array([0, 1, 3]), num_steps=2, seed=0))
    # sample i is seeded by (seed, i): the first image does not depend on the others (up to the
    # rounding of batched vs single products, which can move a uint8 value by one)
    alone = sample_images(model, [0], num_steps=2, seed=0)
    diff = np.abs(alone.astype(np.int16) - images[:1])
    assert diff.max() <= 1 and (diff > 0).mean() < 1e-3, (diff.max(), (diff > 0).mean())
    assert not np.array_equal(images, sample_images(model, [0, 1, 3], num_steps=2, seed=1))
    guided = sample_images(model, torch.tensor([0, 1, 3]), num_steps=2, cfg_scale=3.0, seed=0)
    assert guided.shape == images.shape and not np.array_equal(guided, images)
    # the same weights through a checkpoint give the same images
    ckpt = save_weights(model, tmp_path / 'dit.pth')
    loaded = init_generator(PIXEL_CONFIG, ckpt, cfg_options={'model.sample_cfg.num_steps': 2})
    np.testing.assert_array_equal(sample_images(loaded, [0, 1, 3], seed=0), images)


def test_clear_errors():
    model = init_generator(PIXEL_CONFIG)
    with pytest.raises(ValueError, match='labels is empty'):
        sample_images(model, [])
    with pytest.raises(ValueError, match=r'class labels must be in \[0, 3\]'):
        sample_images(model, [4], num_steps=1)
    with pytest.raises(ValueError, match='cfg_scale must be >= 1'):
        sample_images(model, [0], cfg_scale=0.5)
    with pytest.raises(TypeError, match='needs a DiTDiffusion config'):
        init_generator('configs/super_resolution/polapp-srlight_x2_8xb16-500k_div2k-192.py')


@pytest.mark.parametrize('path', LATENT_CONFIGS, ids=config_id)
def test_latent_configs_build_without_the_vae_and_fail_clearly_on_sampling(path):
    tiny_dit = {'model.dit': dict(type='DiT', arch=dict(depth=1, hidden_size=32, num_heads=2, patch_size=2),
                                  input_size=32, in_channels=4, num_classes=1000, learn_sigma=True)}
    model = init_generator(path, cfg_options=tiny_dit)
    assert model.space == 'latent' and not model.vae.loaded
    with pytest.raises(FileNotFoundError, match="VAE folder 'data/sd-vae-ft-ema' not found.*stabilityai"):
        sample_images(model, [0], num_steps=2, seed=0)
