"""polaformerpp.apis for super-resolution: init_restorer + restore_image on every SR config."""
import numpy as np
import pytest
import torch

from apis_testing import (
    IMG_H,
    IMG_W,
    astronaut_bgr,
    config_id,
    configs_of,
    load,
    one_thread,  # noqa: F401 (fixture)
    perturb,
    save_weights,
)
from polaformerpp.apis import init_restorer, restore_image

SR_CONFIGS = configs_of('super_resolution')
MAIN_CONFIG = 'configs/super_resolution/polapp-srlight_x4_8xb16-500k_div2k-192.py'
#: a small network (the published one is 48 channels x 20 layers)
TINY_NET = {'model.network.embed_dims': 16, 'model.network.depths': (1, 1), 'model.network.num_heads': 2,
            'model.network.window_size': 8}


@pytest.mark.parametrize('path', SR_CONFIGS, ids=config_id)
def test_every_config_restores_a_photograph(path):
    model = init_restorer(path, cfg_options=TINY_NET)
    scale = load(path).model.network.upscale
    assert not model.training and model.scale == scale and model.cfg.model.network.embed_dims == 16
    out = restore_image(model, astronaut_bgr())
    assert out.shape == (IMG_H * scale, IMG_W * scale, 3) and out.dtype == np.uint8


@pytest.mark.parametrize('size', [(17, 23), (8, 8), (35, 9)])
def test_any_image_size(size):
    model = init_restorer(MAIN_CONFIG, cfg_options=TINY_NET)
    img = np.random.default_rng(0).integers(0, 256, (*size, 3), dtype=np.uint8)
    assert restore_image(model, img).shape == (size[0] * 4, size[1] * 4, 3)


def test_checkpoint_channel_order_and_paths(tmp_path):
    import mmcv
    model = init_restorer(MAIN_CONFIG, cfg_options=TINY_NET)
    ckpt = save_weights(perturb(model, seed=1), tmp_path / 'sr.pth')
    loaded = init_restorer(load(MAIN_CONFIG), ckpt, device='cpu', cfg_options=TINY_NET)
    for name, value in model.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[name]), name
    bgr = astronaut_bgr()
    out = restore_image(loaded, bgr)
    # the model works in RGB (its preprocessor subtracts the RGB mean): same as feeding RGB by hand
    rgb = torch.from_numpy(np.ascontiguousarray(bgr[..., ::-1].transpose(2, 0, 1)))
    with torch.no_grad():
        data = loaded.data_preprocessor(dict(inputs=[rgb]), False)
        by_hand = loaded(data['inputs'], mode='predict')[0].pred_img
    np.testing.assert_array_equal(out, by_hand.permute(1, 2, 0).numpy()[..., ::-1])
    assert out.std() > 1  # perturbed weights: not a flat image
    # a path reads as mmcv.imread does (BGR)
    img_path = str(tmp_path / 'astronaut.png')
    mmcv.imwrite(bgr, img_path)
    np.testing.assert_array_equal(restore_image(loaded, img_path), out)


def test_clear_errors(tmp_path):
    model = init_restorer(MAIN_CONFIG, cfg_options=TINY_NET)
    with pytest.raises(ValueError, match=r'\(H, W, 3\) uint8 BGR'):
        restore_image(model, np.zeros((8, 8), np.uint8))
    with pytest.raises(ValueError, match=r'\(H, W, 3\) uint8 BGR'):
        restore_image(model, np.zeros((8, 8, 3), np.float32))
    with pytest.raises(FileNotFoundError, match='image file not found'):
        restore_image(model, str(tmp_path / 'none.png'))
    with pytest.raises(FileNotFoundError, match='config file not found'):
        init_restorer(str(tmp_path / 'none.py'))
    with pytest.raises(TypeError, match='needs a SRRestorer config'):
        init_restorer('configs/generation/dit-tiny-4_polapp_1xb32-2k_demo-shapes-32.py')
