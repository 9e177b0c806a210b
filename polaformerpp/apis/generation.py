"""Class-conditional generation: :func:`init_generator` and :func:`sample_images`."""
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch
from mmengine.config import Config

from .config_loading import build_from_config, load_config

__all__ = ['init_generator', 'sample_images']


def init_generator(config: Union[str, Path, Config], checkpoint: Optional[str] = None, device: str = 'cpu',
                   cfg_options: Optional[dict] = None, allow_partial: bool = False,
                   unsafe_load: bool = False):
    """Build the diffusion model of a ``configs/generation`` config, ready for sampling.

    Args:
        config: config file path or ``Config``.
        checkpoint: weights (``tools/train.py``'s checkpoint; with the EMA hook
            its ``state_dict`` holds the EMA weights); ``None``: random weights.
        device: e.g. ``'cpu'``, ``'cuda:0'``.
        cfg_options: overrides with dotted keys, e.g. ``{'model.sample_cfg.num_steps': 50}``.
        allow_partial: load a checkpoint that does not fill every tensor of the
            model (or has unexpected / mis-shaped ones); refused by default.
        unsafe_load: unpickle a checkpoint you trust in full (``weights_only=False``);
            by default only the types of mmengine's checkpoints are allowed.

    Returns:
        DiTDiffusion: in eval mode, with the config as ``model.cfg``. A latent
        config builds without the VAE weights; they are read on the first decode.
    """
    import polaformerpp.generation  # noqa: F401  (registers DiTDiffusion and the DiTs)
    from polaformerpp.generation import DiTDiffusion
    cfg = load_config(config, cfg_options)
    return build_from_config(cfg, DiTDiffusion, checkpoint, device, 'init_generator', allow_partial=allow_partial,
                             unsafe_load=unsafe_load)


@torch.no_grad()
def sample_images(model, labels: Union[Sequence[int], np.ndarray, torch.Tensor], num_steps: Optional[int] = None,
                  cfg_scale: Optional[float] = None, seed: Optional[int] = None) -> np.ndarray:
    """Generate one image per class label with :meth:`DiTDiffusion.sample`.

    Args:
        model: from :func:`init_generator`.
        labels: ``B`` class indices in ``[0, num_classes)``.
        num_steps: sampling steps (the chain respaced); default the config's ``sample_cfg``.
        cfg_scale: classifier-free guidance scale (1: none); default the config's.
        seed: ``None`` draws from torch's global RNG; an int seeds sample ``i``
            from ``(seed, i)`` as ``tools/generation/sample.py`` does, so the
            images do not depend on the batch or the device.

    Returns:
        np.ndarray: uint8 ``(B, H, W, 3)`` images in RGB order.
    """
    from polaformerpp.generation import sample_generators
    labels = torch.as_tensor(np.asarray(labels), dtype=torch.long).reshape(-1)
    if labels.numel() == 0:
        raise ValueError('labels is empty: give at least one class index')
    if num_steps is not None and num_steps < 1:
        raise ValueError(f'num_steps must be >= 1, got {num_steps}')
    if cfg_scale is not None and cfg_scale < 1:
        raise ValueError(f'cfg_scale must be >= 1 (1 disables guidance), got {cfg_scale}')
    generator = None if seed is None else sample_generators(seed, range(labels.numel()))
    images = model.sample(labels, num_steps=num_steps, cfg_scale=cfg_scale, generator=generator)
    return np.ascontiguousarray(images.permute(0, 2, 3, 1).numpy())
