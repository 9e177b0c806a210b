"""Super-resolution inference: :func:`init_restorer` and :func:`restore_image`."""
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
from mmengine.config import Config

from .config_loading import build_from_config, load_config

__all__ = ['init_restorer', 'restore_image']


def init_restorer(config: Union[str, Path, Config], checkpoint: Optional[str] = None, device: str = 'cpu',
                  cfg_options: Optional[dict] = None, allow_partial: bool = False,
                  unsafe_load: bool = False):
    """Build the SR model of a ``configs/super_resolution`` config, ready for inference.

    Args:
        config: config file path or ``Config``.
        checkpoint: weights to load (``tools/train.py``'s ``iter_N.pth`` or a
            converted file); ``None`` keeps the random initialisation.
        device: e.g. ``'cpu'``, ``'cuda:0'``.
        cfg_options: overrides with dotted keys, e.g. ``{'model.network.upscale': 2}``.
        allow_partial: load a checkpoint that does not fill every tensor of the
            model (or has unexpected / mis-shaped ones); refused by default.
        unsafe_load: unpickle a checkpoint you trust in full (``weights_only=False``);
            by default only the types of mmengine's checkpoints are allowed.

    Returns:
        SRRestorer: in eval mode, with the config as ``model.cfg``.
    """
    from polaformerpp.restoration import SRRestorer
    cfg = load_config(config, cfg_options)
    return build_from_config(cfg, SRRestorer, checkpoint, device, 'init_restorer', allow_partial=allow_partial,
                             unsafe_load=unsafe_load)


def _read_bgr(img: Union[str, Path, np.ndarray]) -> np.ndarray:
    if isinstance(img, (str, Path)):
        import mmcv
        if not Path(img).is_file():
            raise FileNotFoundError(f'image file not found: {str(img)!r}')
        return mmcv.imread(str(img), flag='color', channel_order='bgr')
    if not isinstance(img, np.ndarray):
        raise TypeError(f'img must be an image path or an ndarray, got {type(img).__name__}')
    if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
        raise ValueError(f'img must be an (H, W, 3) uint8 BGR array, got shape {img.shape} dtype {img.dtype}')
    return img


@torch.no_grad()
def restore_image(model, img: Union[str, Path, np.ndarray]) -> np.ndarray:
    """Upscale one image with an :class:`~polaformerpp.restoration.SRRestorer`.

    Args:
        model: from :func:`init_restorer`.
        img: an image path, or a uint8 ``(H, W, 3)`` array in BGR order (what
            ``mmcv.imread`` / ``cv2.imread`` return). Any size works; the
            config's ``pad_to_window`` and ``tile`` settings apply.

    Returns:
        np.ndarray: the super-resolved image, uint8 ``(s H, s W, 3)``, BGR.
    """
    bgr = _read_bgr(img)
    rgb = torch.from_numpy(np.ascontiguousarray(bgr[..., ::-1].transpose(2, 0, 1)))
    # the model's own preprocessor (stack, /255, minus the RGB mean) and 'predict' forward
    sample = model.test_step(dict(inputs=[rgb]))[0]
    out = sample.pred_img.permute(1, 2, 0).numpy()  # (sH, sW, 3) RGB uint8
    return np.ascontiguousarray(out[..., ::-1])
