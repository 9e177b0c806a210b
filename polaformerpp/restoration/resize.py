"""MATLAB-compatible bicubic ``imresize`` (the degradation behind DIV2K and the SR benchmarks).

The LR images of DIV2K, Set5, Set14, B100, Urban100 and Manga109 were made by
MATLAB's ``imresize(HR, 1/s, 'bicubic')``. This module reproduces its
semantics in numpy, one axis at a time:

* Kernel: Keys' cubic convolution with ``a = -0.5``::

      k(x) = 1.5|x|^3 - 2.5|x|^2 + 1              |x| <= 1
           = -0.5|x|^3 + 2.5|x|^2 - 4|x| + 2      1 < |x| <= 2
           = 0                                    otherwise

* Antialiasing: when shrinking by ``scale < 1`` the kernel is stretched,
  ``h(x) = scale * k(scale * x)``, and spans ``4 / scale`` input pixels
  (MATLAB's default ``'Antialiasing', true``). Enlarging uses ``k`` itself.
* Coordinates: output pixel ``i`` (1-based) samples the input at
  ``u = i / scale + 0.5 * (1 - 1 / scale)``; it takes ``ceil(width) + 2``
  taps starting at ``floor(u - width / 2)``, weights ``h(u - j)`` normalised
  to sum to 1.
* Borders: out-of-range taps are mirrored symmetrically (``... 2 1 | 1 2 ...``).
* Axis order: the axis with the smaller scale is resized first (height first
  on ties). Output size is ``ceil(scale * size)``.
* ``method='bilinear'`` swaps in the triangle kernel (width 2), as MATLAB does.
* Output type: float input gives float output (no clipping); uint8 input is
  computed in float64, then rounded and clipped to ``[0, 255]``.
"""
import math
from typing import Optional, Sequence, Tuple

import numpy as np

__all__ = ['cubic_kernel', 'triangle_kernel', 'resize_weights', 'imresize', 'modcrop']


def cubic_kernel(x: np.ndarray) -> np.ndarray:
    """Keys' cubic convolution kernel with ``a = -0.5`` (MATLAB's ``cubic``)."""
    ax = np.abs(x)
    ax2, ax3 = ax ** 2, ax ** 3
    near = (1.5 * ax3 - 2.5 * ax2 + 1) * (ax <= 1)
    far = (-0.5 * ax3 + 2.5 * ax2 - 4 * ax + 2) * ((ax > 1) & (ax <= 2))
    return near + far


def triangle_kernel(x: np.ndarray) -> np.ndarray:
    """Linear interpolation kernel (MATLAB's ``'bilinear'``), width 2."""
    return np.clip(1 - np.abs(x), 0, None)


KERNELS = dict(bicubic=(cubic_kernel, 4.0), bilinear=(triangle_kernel, 2.0))


def resize_weights(in_length: int, out_length: int, scale: float, antialiasing: bool = True,
                   method: str = 'bicubic') -> np.ndarray:
    """Dense ``(out_length, in_length)`` matrix resizing one axis (float64).

    Row ``i`` holds the normalised kernel weights of output pixel ``i``; taps
    falling outside the input are folded back by symmetric mirroring, so a row
    may add several weights into one input pixel.
    """
    if method not in KERNELS:
        raise ValueError(f'method must be one of {tuple(KERNELS)}, got {method!r}')
    kernel, width = KERNELS[method]
    shrink = scale < 1 and antialiasing
    kernel_width = width / scale if shrink else width
    out_pos = np.arange(1, out_length + 1, dtype=np.float64)
    u = out_pos / scale + 0.5 * (1 - 1 / scale)  # 1-based input coordinates
    left = np.floor(u - kernel_width / 2)
    taps = int(math.ceil(kernel_width)) + 2
    indices = left[:, None] + np.arange(taps)[None, :]  # (out, taps), 1-based
    distance = u[:, None] - indices
    weights = scale * kernel(scale * distance) if shrink else kernel(distance)
    weights = weights / weights.sum(axis=1, keepdims=True)

    # symmetric mirroring: 1..n, n..1 repeated
    mirror = np.concatenate([np.arange(in_length), np.arange(in_length)[::-1]])
    cols = mirror[np.mod(indices.astype(np.int64) - 1, 2 * in_length)]
    matrix = np.zeros((out_length, in_length), dtype=np.float64)
    rows = np.repeat(np.arange(out_length), taps)
    np.add.at(matrix, (rows, cols.ravel()), weights.ravel())
    return matrix


def _output_size(in_hw: Tuple[int, int], scale: Optional[float],
                 size: Optional[Sequence[int]]) -> Tuple[Tuple[int, int], Tuple[float, float]]:
    if (scale is None) == (size is None):
        raise ValueError('imresize needs exactly one of scale and size')
    if scale is not None:
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not scale > 0:
            raise ValueError(f'scale must be a positive number, got {scale!r}')
        out_hw = tuple(int(math.ceil(scale * n)) for n in in_hw)
        return out_hw, (float(scale), float(scale))
    if len(size) != 2 or any(int(n) < 1 for n in size):
        raise ValueError(f'size must be (height, width) of positive ints, got {size!r}')
    out_hw = (int(size[0]), int(size[1]))
    return out_hw, (out_hw[0] / in_hw[0], out_hw[1] / in_hw[1])


def imresize(img: np.ndarray, scale: Optional[float] = None,
             size: Optional[Sequence[int]] = None,
             antialiasing: bool = True, method: str = 'bicubic') -> np.ndarray:
    """Resize like MATLAB's ``imresize(img, scale, 'bicubic')``.

    Args:
        img: ``(H, W)`` or ``(H, W, C)``, uint8 or float.
        scale: output/input size ratio (e.g. ``1/3`` to make a x3 LR image).
        size: ``(out_H, out_W)`` instead of ``scale``.
        antialiasing: stretch the kernel when shrinking (MATLAB's default).
        method: ``'bicubic'`` (the SR degradation) or ``'bilinear'``.

    Returns:
        np.ndarray: ``(ceil(scale*H), ceil(scale*W)[, C])``; uint8 (rounded,
        clipped) for uint8 input, float64 otherwise.
    """
    img = np.asarray(img)
    if method not in KERNELS:
        raise ValueError(f'method must be one of {tuple(KERNELS)}, got {method!r}')
    if img.ndim not in (2, 3):
        raise ValueError(f'img must have shape (H, W) or (H, W, C), got {img.shape}')
    if img.dtype != np.uint8 and not np.issubdtype(img.dtype, np.floating):
        raise TypeError(f'img must be uint8 or floating point, got {img.dtype}')
    out_hw, scales = _output_size(img.shape[:2], scale, size)
    out = img.astype(np.float64)
    for axis in sorted((0, 1), key=lambda a: scales[a]):  # stable: height first on ties
        if out_hw[axis] == out.shape[axis] and scales[axis] == 1:
            continue
        matrix = resize_weights(out.shape[axis], out_hw[axis], scales[axis], antialiasing, method)
        out = np.moveaxis(np.tensordot(matrix, np.moveaxis(out, axis, 0), axes=1), 0, axis)
    if img.dtype == np.uint8:
        return np.clip(np.round(out), 0, 255).astype(np.uint8)
    return out


def modcrop(img: np.ndarray, scale: int) -> np.ndarray:
    """Crop the bottom/right so that height and width are multiples of ``scale``."""
    h, w = img.shape[:2]
    return img[:h - h % scale, :w - w % scale, ...]
