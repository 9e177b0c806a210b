"""The SD VAE of latent DiT configs is read on first use: the model builds without it."""
import json

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import MODELS

from conftest import REPO_ROOT
from polaformerpp.generation import SDVAE, DiTDiffusion, dit_param_count
from polaformerpp.generation.vae import VAE_HELP

LATENT_S2 = f'{REPO_ROOT}/configs/generation/dit-s-2_polapp_8xb32-100e_in1k-256.py'


def test_latent_dit_s2_config_builds_without_the_weights():
    cfg = Config.fromfile(LATENT_S2)
    model = MODELS.build(cfg.model)
    assert isinstance(model, DiTDiffusion) and isinstance(model.vae, SDVAE)
    assert not model.vae.loaded and model.vae.path == 'data/sd-vae-ft-ema'
    # parameter counts and the state dict are the DiT's (the VAE is outside the module tree)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in model.dit.parameters())
    buffers = sum(b.numel() for b in model.dit.buffers())  # the fixed sin-cos position embedding
    assert sum(p.numel() for p in model.parameters()) + buffers == dit_param_count('DiT-S/2', attn_type='linear')
    assert not any('vae' in k for k in model.state_dict())
    assert 'loaded=False' in repr(model.vae)
    model.to('cpu').train()  # moving and mode switches need no weights either


def test_encode_decode_and_training_raise_the_clear_error():
    model = MODELS.build(Config.fromfile(LATENT_S2).model)
    images = torch.zeros(1, 3, 256, 256)
    for call in (lambda: model.encode(images), lambda: model.decode(torch.zeros(1, 4, 32, 32)),
                 lambda: model.vae.load(),
                 lambda: model(images, dict(labels=torch.tensor([0])), mode='loss'),
                 lambda: model.sample([0], num_steps=1)):
        with pytest.raises(FileNotFoundError) as info:
            call()
        message = str(info.value)
        assert "VAE folder 'data/sd-vae-ft-ema' not found" in message and VAE_HELP in message
    assert not model.vae.loaded


def test_missing_diffusers_is_reported_on_first_use(tmp_path, monkeypatch):
    import sys
    folder = tmp_path / 'sd-vae'
    folder.mkdir()
    (folder / 'config.json').write_text(json.dumps({'_class_name': 'AutoencoderKL'}))
    vae = SDVAE(str(folder))  # builds: nothing is read yet
    monkeypatch.setitem(sys.modules, 'diffusers', None)  # as if not installed
    with pytest.raises(ImportError, match="optional package 'diffusers' is not installed"):
        vae.encode(torch.zeros(1, 3, 16, 16))
    with pytest.raises(ValueError, match='no path given'):
        SDVAE(None)  # a config without a path is still refused at build time


class _FakeAutoencoderKL(torch.nn.Module):
    """Stands in for diffusers' AutoencoderKL: 8x pooling to 4 channels and back."""

    loads = []

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Conv2d(3, 4, 1)

    @classmethod
    def from_pretrained(cls, path, local_files_only):
        assert local_files_only
        cls.loads.append(path)
        return cls()

    def encode(self, images):
        from types import SimpleNamespace
        mean = self.proj(torch.nn.functional.avg_pool2d(images, 8))
        return SimpleNamespace(latent_dist=SimpleNamespace(mean=mean, sample=lambda: mean))

    def decode(self, latents):
        from types import SimpleNamespace
        return SimpleNamespace(sample=torch.nn.functional.interpolate(latents[:, :3], scale_factor=8))


def test_weights_are_read_once_on_first_use(tmp_path, monkeypatch):
    import sys
    from types import ModuleType
    fake = ModuleType('diffusers.models')
    fake.AutoencoderKL = _FakeAutoencoderKL
    monkeypatch.setitem(sys.modules, 'diffusers', ModuleType('diffusers'))
    monkeypatch.setitem(sys.modules, 'diffusers.models', fake)
    folder = tmp_path / 'sd-vae'
    folder.mkdir()
    (folder / 'config.json').write_text('{}')
    _FakeAutoencoderKL.loads.clear()
    vae = SDVAE(str(folder), scale_factor=0.5)
    assert not vae.loaded and _FakeAutoencoderKL.loads == []
    latents = vae.encode(torch.zeros(2, 3, 16, 16))
    assert vae.loaded and latents.shape == (2, 4, 2, 2) and _FakeAutoencoderKL.loads == [str(folder)]
    assert vae.decode(latents).shape == (2, 3, 16, 16) and len(_FakeAutoencoderKL.loads) == 1
    assert not any(p.requires_grad for p in vae.parameters()) and not vae.vae.training
