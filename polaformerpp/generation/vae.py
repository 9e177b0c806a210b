"""The Stable-Diffusion VAE for latent diffusion, loaded from a local folder only.

Images ``(B, 3, 256, 256)`` in [-1, 1] map to latents ``(B, 4, 32, 32)``
scaled by 0.18215 (the ``sd-vae-ft-ema`` / ``sd-vae-ft-mse`` convention).
The weights are an optional dependency: put a diffusers ``AutoencoderKL``
folder (``config.json`` + ``diffusion_pytorch_model.safetensors`` or ``.bin``,
e.g. a copy of the Hugging Face repository ``stabilityai/sd-vae-ft-ema``)
on disk and name it in the config; nothing is downloaded at run time.
"""
import os.path as osp
from typing import Optional

import torch
import torch.nn as nn
from mmengine.registry import MODELS
from torch import Tensor

__all__ = ['SDVAE', 'VAE_HELP']

VAE_HELP = ("Latent mode needs the Stable-Diffusion VAE weights on disk: download the Hugging Face "
            "repository 'stabilityai/sd-vae-ft-ema' (config.json + diffusion_pytorch_model.*) to a "
            "local folder, install the optional package 'diffusers', and set "
            "model.vae=dict(type='SDVAE', path='<that folder>'). Or use space='pixel'.")


@MODELS.register_module()
class SDVAE(nn.Module):
    """Frozen ``diffusers.AutoencoderKL`` from a local folder, loaded on first use.

    Building it reads nothing: the folder is opened (and ``diffusers``
    imported) by the first :meth:`encode` / :meth:`decode`, or by :meth:`load`.
    A latent-space config thus builds without the weights, for parameter
    counts, FLOPs (of the DiT) and config checks; a missing folder or a
    missing ``diffusers`` is reported, with the steps to get them, when the
    VAE is first needed. The loaded VAE follows the device of its input.

    Args:
        path (str): folder with the VAE's ``config.json`` and weights.
        scale_factor (float): latent scale (0.18215 for the SD VAEs).
        sample_posterior (bool): encode to a sample of the posterior (as DiT's
            training does) rather than its mean.
    """

    def __init__(self, path: Optional[str], scale_factor: float = 0.18215,
                 sample_posterior: bool = True):
        super().__init__()
        if not path:
            raise ValueError(f'SDVAE: no path given. {VAE_HELP}')
        self.path = str(path)
        self.scale_factor = scale_factor
        self.sample_posterior = sample_posterior
        self.vae = None  # the AutoencoderKL, once loaded

    @property
    def loaded(self) -> bool:
        """Whether the weights have been read."""
        return self.vae is not None

    def load(self) -> 'SDVAE':
        """Read the weights now (a no-op once loaded); raises a clear error if they are missing."""
        if self.vae is not None:
            return self
        path = self.path
        if not osp.isdir(path) or not osp.isfile(osp.join(path, 'config.json')):
            raise FileNotFoundError(f'SDVAE: VAE folder {path!r} not found or without config.json. '
                                    f'{VAE_HELP}')
        try:
            from diffusers.models import AutoencoderKL
        except ImportError as exc:
            raise ImportError(f"SDVAE: the optional package 'diffusers' is not installed "
                              f'(pip install diffusers). {VAE_HELP}') from exc
        vae = AutoencoderKL.from_pretrained(path, local_files_only=True)
        self.vae = vae.requires_grad_(False).eval()
        return self

    def _ready(self, x: Tensor) -> nn.Module:
        self.load()
        param = next(self.vae.parameters(), None)
        if param is not None and param.device != x.device:
            self.vae.to(x.device)
        return self.vae

    def train(self, mode: bool = True):
        """The VAE stays in eval mode."""
        return super().train(False)

    @torch.no_grad()
    def encode(self, images: Tensor) -> Tensor:
        """``(B, 3, H, W)`` in [-1, 1] -> scaled latents ``(B, 4, H/8, W/8)``."""
        dist = self._ready(images).encode(images).latent_dist
        latents = dist.sample() if self.sample_posterior else dist.mean
        return latents * self.scale_factor

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """Scaled latents -> images in about [-1, 1]."""
        return self._ready(latents).decode(latents / self.scale_factor).sample

    def extra_repr(self) -> str:
        return f'path={self.path!r}, loaded={self.loaded}, scale_factor={self.scale_factor}'
