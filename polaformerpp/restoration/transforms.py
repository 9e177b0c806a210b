"""Data pipeline for paired SR samples (registered in mmengine's root ``TRANSFORMS``).

A sample travels as a dict. :class:`LoadPairedImages` fills ``gt`` (HR) and
``lr`` as uint8 ``(H, W, 3)`` RGB arrays; the augmentations act on both;
:class:`PackSRInputs` makes ``inputs`` (LR, uint8 ``(3, h, w)`` tensor) and
``data_samples`` (a :class:`~mmengine.structures.BaseDataElement` with
``gt_img`` and the meta information).
"""
from typing import Optional

import numpy as np
import torch
from mmengine.registry import TRANSFORMS
from mmengine.structures import BaseDataElement
from PIL import Image

from .resize import imresize, modcrop

__all__ = ['read_rgb', 'write_rgb', 'LoadPairedImages', 'PairedRandomCrop', 'PairedFlipRot',
           'PackSRInputs']

META_KEYS = ('img_name', 'dataset_name', 'scale', 'gt_path', 'lr_path')


def read_rgb(path: str) -> np.ndarray:
    """Read an image as uint8 ``(H, W, 3)`` RGB.

    Grayscale (L, I;16 with 8-bit content, 1-bit) and palette images are
    converted to RGB by replicating/looking up the channels, which leaves
    their Y channel unchanged; an alpha channel is dropped.
    """
    with Image.open(path) as img:
        if img.mode not in ('RGB', 'L', 'P', 'RGBA', 'LA', '1', 'CMYK', 'YCbCr'):
            raise ValueError(f'{path}: unsupported image mode {img.mode!r} (expected 8-bit RGB '
                             f'or grayscale)')
        return np.asarray(img.convert('RGB'))


def write_rgb(path: str, img: np.ndarray) -> None:
    """Write a uint8 ``(H, W, 3)`` RGB array (lossless for ``.png``)."""
    Image.fromarray(np.ascontiguousarray(img)).save(path)


@TRANSFORMS.register_module()
class LoadPairedImages:
    """Read ``gt_path`` (HR) and ``lr_path`` (LR), or make the LR by bicubic degradation.

    * With ``lr_path``: the HR image must be ``scale`` times the LR size; an
      HR image up to ``scale - 1`` pixels larger (not mod-cropped) is cropped
      at the bottom/right, anything else raises ``ValueError``.
    * Without (``lr_path=None``): the HR image is mod-cropped to a multiple of
      ``scale`` and the LR is ``imresize(HR, 1/scale)``
      (:func:`~polaformerpp.restoration.resize.imresize`, MATLAB-compatible
      bicubic with antialiasing, rounded to uint8).

    Keys read: ``gt_path``, ``lr_path`` (may be None), ``scale``. Keys
    written: ``gt``, ``lr`` (uint8 ``(H, W, 3)``).
    """

    def __call__(self, results: dict) -> dict:
        scale = int(results['scale'])
        gt = read_rgb(results['gt_path'])
        lr_path = results.get('lr_path')
        if lr_path is None:
            gt = modcrop(gt, scale)
            if gt.shape[0] == 0 or gt.shape[1] == 0:
                raise ValueError(f'{results["gt_path"]}: HR image smaller than the scale {scale}')
            lr = imresize(gt, 1.0 / scale)
        else:
            lr = read_rgb(lr_path)
            h, w = lr.shape[:2]
            H, W = gt.shape[:2]
            if not (scale * h <= H < scale * (h + 1) and scale * w <= W < scale * (w + 1)):
                raise ValueError(
                    f'LR/HR size mismatch for x{scale}: LR {lr_path} is {h}x{w}, so HR '
                    f'{results["gt_path"]} must be {scale * h}x{scale * w} (up to {scale - 1} '
                    f'extra pixels are cropped), got {H}x{W}')
            gt = gt[:scale * h, :scale * w]
        results['gt'], results['lr'] = gt, lr
        return results

    def __repr__(self):
        return f'{type(self).__name__}()'


@TRANSFORMS.register_module()
class PairedRandomCrop:
    """Crop aligned patches: a square LR patch and the ``scale`` times larger HR patch.

    Args:
        lr_patch_size (int | None): LR patch side.
        gt_patch_size (int | None): HR patch side instead (the LR side is
            ``gt_patch_size // scale``: 192 gives 96/64/48 at x2/x3/x4).
            Exactly one of the two is given.
    """

    def __init__(self, lr_patch_size: Optional[int] = None, gt_patch_size: Optional[int] = None):
        if (lr_patch_size is None) == (gt_patch_size is None):
            raise ValueError('give exactly one of lr_patch_size and gt_patch_size')
        if (lr_patch_size or gt_patch_size) < 1:
            raise ValueError(f'patch size must be positive, got {lr_patch_size or gt_patch_size}')
        self.lr_patch_size = lr_patch_size
        self.gt_patch_size = gt_patch_size

    def __call__(self, results: dict) -> dict:
        lr, gt, scale = results['lr'], results['gt'], int(results['scale'])
        p = self.lr_patch_size or self.gt_patch_size // scale
        if p < 1:
            raise ValueError(f'gt_patch_size={self.gt_patch_size} is smaller than the scale {scale}')
        h, w = lr.shape[:2]
        if h < p or w < p:
            raise ValueError(f'LR image {results.get("lr_path") or results.get("gt_path")} is '
                             f'{h}x{w}, smaller than the LR patch {p} (lr_patch_size='
                             f'{self.lr_patch_size}, gt_patch_size={self.gt_patch_size})')
        top, left = np.random.randint(0, h - p + 1), np.random.randint(0, w - p + 1)
        results['lr'] = lr[top:top + p, left:left + p]
        results['gt'] = gt[scale * top:scale * (top + p), scale * left:scale * (left + p)]
        return results

    def __repr__(self):
        return (f'{type(self).__name__}(lr_patch_size={self.lr_patch_size}, '
                f'gt_patch_size={self.gt_patch_size})')


@TRANSFORMS.register_module()
class PairedFlipRot:
    """Random horizontal flip, vertical flip and transpose (rot90 with a flip), each with p = 0.5.

    Together they draw uniformly from the 8 symmetries of the square.
    """

    def __init__(self, hflip: bool = True, vflip: bool = True, rot90: bool = True):
        self.hflip, self.vflip, self.rot90 = hflip, vflip, rot90

    def __call__(self, results: dict) -> dict:
        ops = []
        if self.hflip and np.random.rand() < 0.5:
            ops.append(lambda x: x[:, ::-1])
        if self.vflip and np.random.rand() < 0.5:
            ops.append(lambda x: x[::-1])
        if self.rot90 and np.random.rand() < 0.5:
            ops.append(lambda x: x.transpose(1, 0, 2))
        for key in ('lr', 'gt'):
            for op in ops:
                results[key] = op(results[key])
        return results

    def __repr__(self):
        return f'{type(self).__name__}(hflip={self.hflip}, vflip={self.vflip}, rot90={self.rot90})'


@TRANSFORMS.register_module()
class PackSRInputs:
    """``lr`` -> ``inputs`` uint8 ``(3, h, w)``; ``gt`` + meta -> ``data_samples``."""

    def __call__(self, results: dict) -> dict:
        def to_tensor(img: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))

        sample = BaseDataElement(metainfo={k: results[k] for k in META_KEYS if k in results})
        if results.get('gt') is not None:
            sample.gt_img = to_tensor(results['gt'])
        return dict(inputs=to_tensor(results['lr']), data_samples=sample)

    def __repr__(self):
        return f'{type(self).__name__}()'
