"""PSNR and SSIM for super-resolution, with the MATLAB-derived definitions used in SR papers.

* Y channel (ITU-R BT.601, MATLAB ``rgb2ycbcr`` on a double image), for RGB
  values ``R, G, B`` in ``[0, 255]``::

      Y = 16 + (65.481 R + 128.553 G + 24.966 B) / 255        (in [16, 235])

  kept in float64 (not rounded), as the MATLAB evaluation scripts of
  EDSR/RCAN/SwinIR (``rgb2ycbcr(im2double(im))``) do.
* Border: ``crop_border`` pixels are removed from every side before the
  metric; the convention is ``crop_border = scale``.
* PSNR: ``10 log10(255^2 / MSE)``; ``inf`` for identical images.
* SSIM (Wang et al. 2004, ``ssim_index.m``): 11x11 Gaussian window with
  sigma 1.5 (normalised), ``C1 = (0.01 * 255)^2``, ``C2 = (0.03 * 255)^2``,
  'valid' filtering, mean of the SSIM map. RGB mode averages the channels.

Images given to the metrics are uint8 ``(3, H, W)`` tensors (the network's
output is clamped to ``[0, 1]`` and rounded to 8 bits, exactly what is saved
as PNG). Per-image values are averaged over a dataset; with several test sets
in one run (e.g. a ``ConcatDataset`` of Set5, Set14, ...), each set also gets
its own ``'<dataset_name>/<metric>'`` entry.
"""
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from mmengine.evaluator import BaseMetric
from mmengine.registry import METRICS

__all__ = ['rgb_to_y', 'psnr', 'ssim', 'PSNR', 'SSIM']

_Y_WEIGHTS = np.array([65.481, 128.553, 24.966]) / 255.0


def rgb_to_y(img: np.ndarray) -> np.ndarray:
    """BT.601 luma of an RGB image: ``(H, W, 3)`` in [0, 255] -> ``(H, W)`` float64 in [16, 235]."""
    img = np.asarray(img, dtype=np.float64)
    if img.ndim != 3 or img.shape[-1] != 3:
        raise ValueError(f'rgb_to_y expects an (H, W, 3) RGB image, got shape {img.shape}')
    return 16.0 + img @ _Y_WEIGHTS


def _prepare(img: np.ndarray, ref: np.ndarray, crop_border: int, test_y_channel: bool):
    """Both images as float64 ``(H, W, C)`` (C = 1 for Y), borders removed."""
    img, ref = np.asarray(img), np.asarray(ref)
    if img.shape != ref.shape:
        raise ValueError(f'the SR output and the HR image must have one shape, got {img.shape} '
                         f'and {ref.shape}')
    if img.ndim != 3 or img.shape[-1] != 3:
        raise ValueError(f'images must be (H, W, 3) RGB arrays, got shape {img.shape}')
    if crop_border < 0 or 2 * crop_border >= min(img.shape[:2]):
        raise ValueError(f'crop_border={crop_border} leaves nothing of a {img.shape[:2]} image')
    if crop_border:
        img = img[crop_border:-crop_border, crop_border:-crop_border]
        ref = ref[crop_border:-crop_border, crop_border:-crop_border]
    if test_y_channel:
        return rgb_to_y(img)[..., None], rgb_to_y(ref)[..., None]
    return img.astype(np.float64), ref.astype(np.float64)


def psnr(img: np.ndarray, ref: np.ndarray, crop_border: int = 0,
         test_y_channel: bool = True) -> float:
    """PSNR in dB of ``img`` against ``ref``, both ``(H, W, 3)`` RGB in [0, 255]."""
    img, ref = _prepare(img, ref, crop_border, test_y_channel)
    mse = np.mean((img - ref) ** 2)
    return float('inf') if mse == 0 else float(10.0 * np.log10(255.0 ** 2 / mse))


def _gaussian_window(size: int = 11, sigma: float = 1.5) -> np.ndarray:
    x = np.arange(size, dtype=np.float64) - (size - 1) / 2
    g = np.exp(-x ** 2 / (2 * sigma ** 2))
    return g / g.sum()


def _filter_valid(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Separable 'valid' filtering of ``(H, W)`` with the 1-D kernel ``g`` on both axes."""
    k = len(g)
    x = np.lib.stride_tricks.sliding_window_view(x, k, axis=0) @ g
    return np.lib.stride_tricks.sliding_window_view(x, k, axis=1) @ g


def _ssim_single(x: np.ndarray, y: np.ndarray) -> float:
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    g = _gaussian_window()
    mu_x, mu_y = _filter_valid(x, g), _filter_valid(y, g)
    var_x = _filter_valid(x * x, g) - mu_x ** 2
    var_y = _filter_valid(y * y, g) - mu_y ** 2
    cov = _filter_valid(x * y, g) - mu_x * mu_y
    ssim_map = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x ** 2 + mu_y ** 2 + c1) *
                                                           (var_x + var_y + c2))
    return float(ssim_map.mean())


def ssim(img: np.ndarray, ref: np.ndarray, crop_border: int = 0,
         test_y_channel: bool = True) -> float:
    """SSIM of ``img`` against ``ref``, both ``(H, W, 3)`` RGB in [0, 255]."""
    img, ref = _prepare(img, ref, crop_border, test_y_channel)
    if min(img.shape[:2]) < 11:
        raise ValueError(f'SSIM needs at least 11x11 pixels after the border crop, '
                         f'got {img.shape[:2]}')
    return float(np.mean([_ssim_single(img[..., c], ref[..., c]) for c in range(img.shape[-1])]))


def _to_hwc_uint8(img) -> np.ndarray:
    """A ``(3, H, W)`` uint8 tensor (or array) -> ``(H, W, 3)`` numpy."""
    if isinstance(img, torch.Tensor):
        img = img.detach().cpu().numpy()
    img = np.asarray(img)
    if img.ndim != 3 or img.shape[0] != 3:
        raise ValueError(f'expected a (3, H, W) image, got shape {img.shape}')
    return img.transpose(1, 2, 0)


class _SRMetric(BaseMetric):
    """Per-image metric on the Y channel (or RGB), averaged per dataset.

    Args:
        crop_border (int | None): pixels removed from each side; ``None``
            uses each sample's ``scale`` (the usual convention).
        test_y_channel (bool): evaluate on BT.601 Y (True) or on RGB.
        collect_device, prefix: see :class:`mmengine.evaluator.BaseMetric`.
    """

    metric_name = ''
    default_prefix: Optional[str] = ''  # metric keys: 'PSNR', '<dataset>/PSNR'

    def __init__(self, crop_border: Optional[int] = None, test_y_channel: bool = True,
                 collect_device: str = 'cpu', prefix: Optional[str] = None):
        super().__init__(collect_device=collect_device, prefix=prefix)
        if crop_border is not None and (not isinstance(crop_border, int) or crop_border < 0):
            raise ValueError(f'crop_border must be None (= scale) or an int >= 0, got {crop_border!r}')
        self.crop_border = crop_border
        self.test_y_channel = test_y_channel

    def compute_one(self, pred: np.ndarray, gt: np.ndarray, crop_border: int) -> float:
        raise NotImplementedError

    def process(self, data_batch, data_samples: Sequence) -> None:
        """Score each sample (a dict, as mmengine's Evaluator passes them, or a data element)."""
        for sample in data_samples:
            if sample.get('pred_img') is None or sample.get('gt_img') is None:
                raise KeyError(f'{type(self).__name__} needs pred_img and gt_img in every data sample')
            crop = self.crop_border if self.crop_border is not None else sample.get('scale')
            if crop is None:
                raise KeyError('crop_border=None (= scale) needs the scale in every data sample')
            value = self.compute_one(_to_hwc_uint8(sample.get('pred_img')),
                                     _to_hwc_uint8(sample.get('gt_img')), int(crop))
            self.results.append((sample.get('dataset_name'), value))

    def compute_metrics(self, results: List) -> Dict[str, float]:
        values = np.array([v for _, v in results], dtype=np.float64)
        metrics = OrderedDict()
        metrics[self.metric_name] = float(values.mean())
        names = list(OrderedDict.fromkeys(name for name, _ in results))
        if len(names) > 1:
            for name in names:
                metrics[f'{name}/{self.metric_name}'] = float(
                    np.mean([v for n, v in results if n == name]))
        return metrics


@METRICS.register_module()
class PSNR(_SRMetric):
    """Peak signal-to-noise ratio (dB), Y channel and ``crop_border = scale`` by default."""

    metric_name = 'PSNR'

    def compute_one(self, pred, gt, crop_border):
        return psnr(pred, gt, crop_border, self.test_y_channel)


@METRICS.register_module()
class SSIM(_SRMetric):
    """Structural similarity (MATLAB ``ssim_index``), Y channel and ``crop_border = scale`` by default."""

    metric_name = 'SSIM'

    def compute_one(self, pred, gt, crop_border):
        return ssim(pred, gt, crop_border, self.test_y_channel)
