"""2-D rotary position tables (the decoupled RoPE of PolaFormer++).

A feature vector of ``channels`` entries is rotated pairwise: channels
``[0, channels/2)`` by angles of the row index and ``[channels/2, channels)`` by
angles of the column index. The frequencies are ``1 / 10000 ** linspace(0, 1,
channels / 4)``, each repeated for the two channels of a rotation pair.

The polarity-aware linear attention rotates its 2d-channel feature maps
(``channels = 2 * head_dim``); the softmax attention of the late stages rotates
q and k themselves (``channels = head_dim``).
"""
from typing import NamedTuple, Tuple, Union

import torch
from torch import Tensor

from .tracing import is_tracing

__all__ = ['rope_frequencies', 'rope_2d_tables', 'pola_rope_tables', 'pola_rope_factors', 'RopeGrid',
           'RopeHalves', 'rope_halves', 'apply_rope', 'apply_rope_2d', 'rope_2d_rotation', 'complex_pairs']


class RopeGrid(NamedTuple):
    """The 2-D RoPE of :func:`pola_rope_tables` on a ``height x width`` token grid, by its size.

    Passed as ``rope=RopeGrid(H, W)`` to :func:`~polaformerpp.ops.pola_attention`,
    it gives the same rotation as ``rope=pola_rope_tables(H, W, d)``, but the
    backends read per-row and per-column tables (:func:`pola_rope_factors`,
    ``O((H + W) d)``) instead of two ``(H W, 2d)`` tables.
    """
    height: int
    width: int


class RopeHalves(NamedTuple):
    """A rotation of the ``2d`` feature channels as two ``(rows, d)`` table pairs.

    ``sin_lo``/``cos_lo`` rotate feature channels ``[0, d)``, ``sin_hi``/``cos_hi``
    channels ``[d, 2d)``; channels ``2i`` and ``2i+1`` share one angle.
    ``grid_width == 0``: token ``n`` reads row ``n`` of both (the halves of
    ``(N, 2d)`` tables); ``grid_width == W > 0``: token ``n`` reads row ``n // W``
    of the lo (row angles, ``(H, d)``) and row ``n % W`` of the hi (column
    angles, ``(W, d)``) tables (a :class:`RopeGrid`).
    """
    sin_lo: Tensor
    cos_lo: Tensor
    sin_hi: Tensor
    cos_hi: Tensor
    grid_width: int


def rope_frequencies(channels: int, device=None) -> Tensor:
    """Rotation frequency of every channel of one axis' half.

    Returns:
        Tensor: ``(channels // 2,)`` fp32, ``1 / 10000 ** linspace(0, 1,
        channels // 4)`` with each value repeated twice (one rotation pair).
    """
    if channels % 4 != 0 or channels <= 0:
        raise ValueError(f'channels must be a positive multiple of 4 for a 2-D RoPE '
                         f'(two axes x channel pairs), got {channels}')
    freqs = 1.0 / (10000 ** torch.linspace(0, 1, channels // 4, device=device, dtype=torch.float32))
    return freqs.repeat_interleave(2)


def rope_2d_tables(height: int, width: int, channels: int, device=None,
                   dtype: torch.dtype = torch.float32) -> Tuple[Tensor, Tensor]:
    """(sin, cos) tables of a 2-D RoPE over an ``height x width`` grid.

    Tokens are numbered row-major (``n = row * width + col``).

    Returns:
        tuple[Tensor, Tensor]: ``sin`` and ``cos``, each ``(height * width, channels)``.
    """
    angle = _rope_2d_angles(height, width, rope_frequencies(channels, device=device))
    return angle.sin().to(dtype), angle.cos().to(dtype)


def _rope_2d_angles(height: int, width: int, freqs: Tensor) -> Tensor:
    """``(height * width, 2 * len(freqs))`` fp32 angles: row index times ``freqs``, then column index times them."""
    for name, value in (('height', height), ('width', width)):
        # ints, or traced / symbolic sizes under torch.jit.trace, torch.compile and torch.export
        # (compared, not converted: int() would fix a symbolic size to its traced value)
        if isinstance(value, (bool, float)) or value < 1:
            raise ValueError(f'{name} must be a positive int, got {value!r}')
    rows = torch.arange(height, device=freqs.device, dtype=torch.float32)
    cols = torch.arange(width, device=freqs.device, dtype=torch.float32)
    angle_h = (rows[:, None] * freqs[None, :])[:, None, :].expand(height, width, -1)
    angle_w = (cols[:, None] * freqs[None, :])[None, :, :].expand(height, width, -1)
    return torch.cat([angle_h, angle_w], dim=-1).reshape(height * width, 2 * freqs.numel())


def pola_rope_tables(height: int, width: int, head_dim: int, device=None,
                     dtype: torch.dtype = torch.float32) -> Tuple[Tensor, Tensor]:
    """RoPE tables for :func:`pola_attention` on an ``height x width`` token grid.

    The polarity-aware feature maps have ``2 * head_dim`` channels: row angles
    fill ``[0, head_dim)``, column angles ``[head_dim, 2 * head_dim)``.

    Returns:
        tuple[Tensor, Tensor]: ``sin`` and ``cos``, each ``(height * width, 2 * head_dim)``.
    """
    if head_dim % 2 != 0 or head_dim <= 0:
        raise ValueError(f'head_dim must be a positive even number, got {head_dim}')
    return rope_2d_tables(height, width, 2 * head_dim, device=device, dtype=dtype)


def apply_rope(x: Tensor, sin: Tensor, cos: Tensor) -> Tensor:
    """Rotate channel pairs ``(x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin)``.

    Args:
        x: ``(..., N, C)``.
        sin, cos: ``(N, C)``, broadcast over the leading dims of ``x``.
    """
    x0, x1 = x[..., 0::2], x[..., 1::2]
    rotated = torch.stack([-x1, x0], dim=-1).flatten(-2)
    return x * cos + rotated * sin


#: real dtypes whose channel pairs rotate as complex numbers (:func:`apply_rope_2d`)
_COMPLEX_OF = {torch.float32: torch.complex64, torch.float64: torch.complex128}


def apply_rope_2d(height: int, width: int, *xs: Tensor) -> Tuple[Tensor, ...]:
    """``apply_rope(x, *rope_2d_tables(height, width, C))`` for each ``x``: the 2-D RoPE over their token grid.

    In eager mode, for fp32/fp64 ``x`` whose channel pairs are adjacent in
    memory, each pair ``(x0, x1)`` is read as the complex number ``x0 + i x1``
    and multiplied by ``cos + i sin`` (:func:`rope_2d_rotation`): one pass
    forward and one backward (4-5x faster than the real form's five), with the
    same values. Under autograd the result keeps ``x``'s memory layout;
    otherwise it is written contiguous (attention kernels read ``(B, h, N, d)``
    heads faster contiguous than as strided views of a projection: 5% for
    CPU flash attention at 4096 tokens). Tracers, export and other dtypes take
    :func:`apply_rope` (no complex tensors there). The tables or the rotation
    are built once for all ``xs``.

    Args:
        xs: each ``(..., N, C)``, one ``C`` for all, with ``N = height * width``
            (row-major) and ``C % 4 == 0``.

    Returns:
        tuple[Tensor, ...]: the rotated ``xs``, in order.
    """
    factors, rotated = {}, []  # (form, dtype) -> the tables or the rotation
    for x in xs:
        complex_form = _rotates_as_complex(x)
        key = (complex_form, x.dtype)
        if key not in factors:
            factors[key] = (rope_2d_rotation(height, width, x.shape[-1], device=x.device).to(_COMPLEX_OF[x.dtype])
                            if complex_form else
                            rope_2d_tables(height, width, x.shape[-1], device=x.device, dtype=x.dtype))
        if not complex_form:
            rotated.append(apply_rope(x, *factors[key]))
            continue
        rotation = factors[key]
        if torch.is_grad_enabled() and x.requires_grad:
            rotated.append(torch.view_as_real(complex_pairs(x) * rotation).flatten(-2))
            continue
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        torch.mul(complex_pairs(x), rotation, out=complex_pairs(out))
        rotated.append(out)
    return tuple(rotated)


def rope_2d_rotation(height: int, width: int, channels: int, device=None) -> Tensor:
    """The rotation of :func:`rope_2d_tables` as one complex64 factor ``cos + i sin`` per channel pair.

    Returns:
        Tensor: ``(height * width, channels // 2)``; pair ``j`` of token ``n`` is channels ``2j, 2j + 1``.
    """
    angle = _rope_2d_angles(height, width, rope_frequencies(channels, device=device)[0::2])  # one per pair
    return torch.complex(angle.cos(), angle.sin())


def complex_pairs(x: Tensor) -> Tensor:
    """``(..., C)`` real with adjacent channel pairs -> ``(..., C / 2)`` complex view ``x[2j] + i x[2j + 1]``."""
    return torch.view_as_complex(x.unflatten(-1, (x.shape[-1] // 2, 2)))


def _rotates_as_complex(x: Tensor) -> bool:
    """Eager, a real dtype with a complex counterpart, pairs adjacent and complex-aligned strides/offset."""
    if is_tracing() or x.dtype not in _COMPLEX_OF or x.stride(-1) != 1:
        return False
    return x.storage_offset() % 2 == 0 and all(s % 2 == 0 for s in x.stride()[:-1])


def pola_rope_factors(height: int, width: int, head_dim: int, device=None,
                      dtype: torch.dtype = torch.float32) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Separable form of :func:`pola_rope_tables`: row and column tables.

    Token ``n = row * width + col`` of ``pola_rope_tables(height, width,
    head_dim)`` has ``sin[n, :head_dim] == row_sin[row]`` and ``sin[n,
    head_dim:] == col_sin[col]`` (same for cos), value for value.

    Returns:
        tuple[Tensor, Tensor, Tensor, Tensor]: ``row_sin``, ``row_cos``
        ``(height, head_dim)`` and ``col_sin``, ``col_cos`` ``(width, head_dim)``.
    """
    if head_dim % 2 != 0 or head_dim <= 0:
        raise ValueError(f'head_dim must be a positive even number, got {head_dim}')
    freqs = rope_frequencies(2 * head_dim, device=device)  # (head_dim,)
    tables = []
    for size in (height, width):
        angle = torch.arange(size, device=device, dtype=torch.float32)[:, None] * freqs[None, :]
        tables += [angle.sin().to(dtype), angle.cos().to(dtype)]
    return tuple(tables)


def rope_halves(rope: Union[RopeGrid, Tuple[Tensor, Tensor]], head_dim: int, device=None) -> RopeHalves:
    """The rotation of feature channels ``[0, d)`` (lo) and ``[d, 2d)`` (hi) as ``(rows, d)`` tables.

    * ``RopeGrid(H, W)``: the row tables ``(H, d)`` (lo) and the column
      tables ``(W, d)`` (hi) of :func:`pola_rope_factors` (fp32 on
      ``device``); ``grid_width = W``;
    * ``(sin, cos)`` tables ``(N, 2d)``: their two halves (views of contiguous
      tables, so sin and cos share strides; dtype and device unchanged);
      ``grid_width = 0``.
    """
    if isinstance(rope, RopeGrid):
        return RopeHalves(*pola_rope_factors(*rope, head_dim, device=device), rope.width)
    sin, cos = (t.contiguous() for t in rope)
    return RopeHalves(sin[:, :head_dim], cos[:, :head_dim], sin[:, head_dim:], cos[:, head_dim:], 0)
