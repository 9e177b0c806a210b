"""Sampling helpers: classifier-free guidance, per-sample seeds, image conversion."""
from typing import List, Sequence

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from .diffusion import ModelFn

__all__ = ['guided_model_fn', 'sample_generators', 'to_uint8', 'make_grid']


def guided_model_fn(net: nn.Module, labels: Tensor, cfg_scale: float = 1.0) -> ModelFn:
    """``model_fn(x, t)`` of a class-conditional DiT with classifier-free guidance.

    With ``cfg_scale == 1`` the network runs once on ``labels``. Otherwise
    it runs on the conditional and the null labels in one doubled batch and the
    noise becomes ``eps_u + s * (eps_c - eps_u)``; the variance channels (if
    any) are the conditional ones.

    Args:
        net: ``net(x (B,C,H,W), t (B,), y (B,)) -> (B, C or 2C, H, W)``.
        labels: ``(B,)`` class labels.
        cfg_scale: guidance scale ``s >= 1`` (1 = no guidance).
    """
    if cfg_scale < 1.0:
        raise ValueError(f'cfg_scale must be >= 1 (1 disables guidance), got {cfg_scale}')
    if cfg_scale == 1.0:
        return lambda x, t: net(x, t, labels)
    null = torch.full_like(labels, net.null_class)

    def model_fn(x: Tensor, t: Tensor) -> Tensor:
        out = net(torch.cat([x, x]), torch.cat([t, t]), torch.cat([labels, null]))
        cond, uncond = out.chunk(2)
        channels = x.shape[1]
        eps = uncond[:, :channels] + cfg_scale * (cond[:, :channels] - uncond[:, :channels])
        return torch.cat([eps, cond[:, channels:]], dim=1)

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


def to_uint8(images: Tensor) -> Tensor:
    """Images in ``[-1, 1]`` ``(B, 3, H, W)`` -> uint8 ``(B, 3, H, W)`` (rounded, clipped)."""
    return ((images.float() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)


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
