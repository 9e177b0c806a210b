"""Sampling helpers: classifier-free guidance, per-sample seeds, image conversion."""
from typing import List, Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from .diffusion import ModelFn

__all__ = ['guided_model_fn', 'random_class_labels', 'sample_generators', 'to_uint8', 'make_grid']


def guided_model_fn(net: nn.Module, labels: Tensor, cfg_scale: float = 1.0,
                    channels: Optional[int] = None) -> ModelFn:
    """``model_fn(x, t)`` of a class-conditional DiT with classifier-free guidance.

    With ``cfg_scale == 1`` the network runs once on ``labels``. Otherwise
    it runs on the conditional and the null labels in one doubled batch and the
    first ``channels`` output channels become ``eps_u + s * (eps_c - eps_u)``;
    the other channels (the rest of the noise, the variance) are the conditional ones.

    Args:
        net: ``net(x (B,C,H,W), t (B,), y (B,)) -> (B, C or 2C, H, W)``.
        labels: ``(B,)`` class labels.
        cfg_scale: guidance scale ``s >= 1`` (1 = no guidance).
        channels: guided channels; ``None``: all ``C`` noise channels (the standard
            formula). DiT's released sampler guides the first 3 of the 4 latent channels.
    """
    if cfg_scale < 1.0:
        raise ValueError(f'cfg_scale must be >= 1 (1 disables guidance), got {cfg_scale}')
    if channels is not None and channels < 1:
        raise ValueError(f'channels must be None or >= 1, got {channels}')
    if cfg_scale == 1.0:
        return lambda x, t: net(x, t, labels)
    null = torch.full_like(labels, net.null_class)

    def model_fn(x: Tensor, t: Tensor) -> Tensor:
        out = net(torch.cat([x, x]), torch.cat([t, t]), torch.cat([labels, null]))
        cond, uncond = out.chunk(2)
        c = x.shape[1] if channels is None else min(channels, x.shape[1])
        eps = uncond[:, :c] + cfg_scale * (cond[:, :c] - uncond[:, :c])
        return torch.cat([eps, cond[:, c:]], dim=1)

    return model_fn


def sample_generators(seed: int, indices: Sequence[int]) -> List[torch.Generator]:
    """One CPU generator per global sample index, seeded from ``(seed, index)``.

    Sample ``i`` of a run thus gets the same noise whatever the batch size or
    number of processes.
    """
    generators = []
    for index in indices:
        state = np.random.SeedSequence([int(seed), int(index)]).generate_state(2, dtype=np.uint32)
        generators.append(torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1])))
    return generators


def random_class_labels(num_samples: int, num_classes: int, seed: int = 0) -> np.ndarray:
    """``num_samples`` labels drawn independently and uniformly from ``[0, num_classes)``.

    The labels of an FID run, as DiT's sampler draws them (``randint`` per
    sample), from one seeded stream, so they do not depend on the process count.
    """
    return np.random.default_rng(seed).integers(0, num_classes, num_samples).astype(np.int64)


def to_uint8(images: Tensor) -> Tensor:
    """Images in ``[-1, 1]`` ``(B, 3, H, W)`` -> uint8 ``(B, 3, H, W)``.

    ``clamp(127.5 x + 128, 0, 255)`` truncated to an integer, as DiT's sampler
    writes its samples (rounding to nearest, ties up).
    """
    return (images.float() * 127.5 + 128).clamp(0, 255).to(torch.uint8)


def make_grid(images: np.ndarray, nrow: int = 8, padding: int = 2) -> np.ndarray:
    """uint8 ``(N, H, W, 3)`` -> one uint8 ``(rows*(H+p)+p, nrow*(W+p)+p, 3)`` grid image."""
    n, h, w, c = images.shape
    nrow = max(1, min(nrow, n))
    rows = (n + nrow - 1) // nrow
    grid = np.zeros((rows * (h + padding) + padding, nrow * (w + padding) + padding, c), np.uint8)
    for i, img in enumerate(images):
        r, col = divmod(i, nrow)
        y, x = padding + r * (h + padding), padding + col * (w + padding)
        grid[y:y + h, x:x + w] = img
    return grid
