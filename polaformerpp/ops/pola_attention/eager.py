"""Eager, chunked PyTorch backend of :func:`~polaformerpp.ops.pola_attention` (``backend='torch'``).

Differentiable (autograd through plain torch ops), any floating dtype, and
what torch.compile, torch.jit.trace and the FLOP counter see. The method is
written out in the package docstring.
"""
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ..rope import RopeHalves
from .common import (
    Rope,
    as_rope_halves,
    check_rope_pairs,
    check_temperatures,
    chunk_tokens,
    compute_dtype,
    is_tracing,
    key_exponent_shifts,
    key_normalisation,
    needs_exponent_shift,
    query_exponent_shifts,
    shifted_eps,
    signed_rows,
    signed_temperatures,
    token_chunks,
)

__all__ = ['pola_attention_torch']

def _spiky(x: Tensor) -> Tensor:
    """``exp(relu(x)) - 1`` in two passes: ``softshrink(exp(x), 1)``.

    ``exp(x) > 1`` exactly when ``x > 0``, and softshrink subtracts 1 there and
    returns 0 elsewhere, so the inactive polarity is exactly zero.
    """
    return F.softshrink(torch.exp(x), 1.0)


def _key_features(k: Tensor) -> Tensor:
    """``phi_k = [exp(k+) - 1, exp(k-) - 1]``: ``(..., n, d) -> (..., n, 2d)``.

    One exp per element: ``exp(-k) = 1 / exp(k)``.
    """
    e = torch.exp(k)
    return F.softshrink(torch.stack([e, e.reciprocal()], dim=-2), 1.0).flatten(-2)


def _query_features(q: Tensor, signed_temps: Tensor) -> Tensor:
    """Both streams' query maps: ``(B, h, n, d) -> (B, h, n, 2, 2d)`` (``[phi_s, phi_o]``).

    ``signed_temps``: ``(h, 4, d)`` from :func:`~.common.signed_temperatures`.
    """
    x = q.unsqueeze(-2) * signed_temps[None, :, None]  # (B, h, n, 4, d)
    return _spiky(x).flatten(-2).unflatten(-1, (2, -1))


def _shifted_key_features(k: Tensor, key_shifts: Tensor) -> Tensor:
    """Shifted key maps ``exp(x - b) - exp(-b)`` over ``x = relu([k, -k])``: ``(B, h, n, d) -> (B, h, n, 2d)``.

    ``key_shifts``: ``(B, h, 2d)`` (:func:`~.common.key_exponent_shifts`).
    Written ``exp(x - b) * (1 - exp(-x))`` (``-expm1(-x)``): no cancellation
    for small ``x``, exactly zero on the inactive polarity.
    """
    shifts = key_shifts.unflatten(-1, (2, -1))[:, :, None]  # (B, h, 1, 2, d)
    x = F.relu(torch.stack([k, -k], dim=-2))  # (B, h, n, 2, d)
    return (torch.exp(x - shifts) * -torch.expm1(-x)).flatten(-2)


def _shifted_query_features(exponents: Tensor, log_rows: Tensor, query_shifts: Tensor) -> Tensor:
    """Shifted query maps ``exp(x + L - c) - exp(L - c)`` of both streams: ``(B, h, n, 2, 2d)``.

    Written ``exp(x + L - c) * (1 - exp(-x))`` over ``x = relu(exponents)``
    (no cancellation for small ``x``; exactly zero on the inactive polarity).

    Args:
        exponents: ``(B, h, n, 4, d)``, ``q`` times the signed temperature rows.
        log_rows: ``(B, h, 4, d)``, the keys' log scale ``L`` per row (:func:`~.common.key_normalisation`).
        query_shifts: ``(B, h, n, 2)`` (:func:`~.common.query_exponent_shifts`).
    """
    offsets = log_rows[:, :, None] - query_shifts.repeat_interleave(2, dim=-1)[..., None]  # (B, h, n, 4, d)
    x = F.relu(exponents)
    return (torch.exp(x + offsets) * -torch.expm1(-x)).flatten(-2).unflatten(-1, (2, -1))


def _swap_pairs(x: Tensor) -> Tensor:
    """Exchange channels ``2i`` and ``2i + 1`` of ``(..., 2c)``."""
    pairs = x.unflatten(-1, (-1, 2))
    return torch.stack([pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)


class _PairRotation(torch.autograd.Function):
    """``R(x) = x * cos + swap(x) * sin_signed`` in real arithmetic, the inverse rotation as its backward.

    ``sin_signed`` is ``(-sin, sin)`` per pair, so a pair ``(x0, x1)`` becomes
    ``(x0 cos - x1 sin, x1 cos + x0 sin)``. Autograd of the same expression
    would build its backward from the swap's stack and selects (zero-filled
    scatters); the transpose of a rotation is the rotation by the opposite
    angle, ``g * cos - swap(g) * sin_signed``, as cheap as the forward. The
    angle tables are constants (RoPE buffers): they get no gradient.
    """

    @staticmethod
    def forward(ctx, x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
        ctx.save_for_backward(cos, sin_signed)
        return torch.addcmul(x * cos, _swap_pairs(x), sin_signed)

    @staticmethod
    def backward(ctx, grad: Tensor):
        cos, sin_signed = ctx.saved_tensors
        return torch.addcmul(grad * cos, _swap_pairs(grad), sin_signed, value=-1), None, None


def _chunk_table(lo: Tensor, hi: Tensor, grid_width: int, start: int, stop: int) -> Tensor:
    """Tokens ``[start, stop)``'s rows of the two table halves, joined along the last (channel) axis.

    ``lo``/``hi``: ``(rows, ..., c)``. On a grid (``grid_width > 0``) the chunk is
    whole grid rows: its row angles are its rows of ``lo`` broadcast over the
    columns, and ``hi`` (the column angles) repeats for every row. Slices and
    broadcasts only (no gathers, nothing data-dependent), so tracing and
    export see static shapes.
    """
    if not grid_width:
        return torch.cat([lo[start:stop], hi[start:stop]], dim=-1)
    rows, first = (stop - start) // grid_width, start // grid_width
    lo_rows = lo[first:first + rows, None].expand(rows, grid_width, *lo.shape[1:])
    hi_rows = hi[None, :grid_width].expand(rows, grid_width, *hi.shape[1:])
    return torch.cat([lo_rows, hi_rows], dim=-1).flatten(0, 1)


class _RealRotation:
    """RoPE of a chunk's features in real arithmetic (what tracing, export and compile see)."""

    def __init__(self, rope: RopeHalves, dtype: torch.dtype):
        self.grid_width = rope.grid_width
        self.lo, self.hi = (self._table(sin, cos, dtype) for sin, cos in ((rope.sin_lo, rope.cos_lo),
                                                                          (rope.sin_hi, rope.cos_hi)))

    @staticmethod
    def _table(sin: Tensor, cos: Tensor, dtype: torch.dtype) -> Tensor:
        """``(rows, c)`` tables -> ``(rows, 2, c)`` ``[cos, sin_signed]``, ``sin_signed = (-sin, sin)`` per pair."""
        sin_signed = torch.stack([-sin[:, 0::2], sin[:, 1::2]], dim=-1).flatten(-2)
        return torch.stack([cos, sin_signed], dim=1).to(dtype)

    def __call__(self, x: Tensor, start: int, stop: int) -> Tensor:
        """``x``: ``(B, h, n, [streams,] 2d)`` of tokens ``[start, stop)``, rotated."""
        table = _chunk_table(self.lo, self.hi, self.grid_width, start, stop)  # (n, 2, 2d)
        cos, sin_signed = table[:, 0], table[:, 1]
        if x.dim() == 5:  # (B, h, n, 2, 2d): both query streams take their token's angles
            cos, sin_signed = cos[:, None], sin_signed[:, None]
        return _PairRotation.apply(x, cos, sin_signed)


class _ComplexRotation(_RealRotation):
    """The same rotation as one complex product ``(x0 + i x1) * (cos + i sin)`` per pair.

    One fused kernel where the real form takes several passes: the eager
    backend's choice outside tracing. (Complex tensors do not export to ONNX
    and trouble torch.compile, so traced graphs use :class:`_RealRotation`.)
    """

    @staticmethod
    def _table(sin: Tensor, cos: Tensor, dtype: torch.dtype) -> Tensor:
        """``(rows, c)`` tables -> unit complex numbers ``(rows, c/2)``, one per channel pair."""
        return torch.complex(cos[:, 0::2].to(dtype), sin[:, 0::2].to(dtype))

    def __call__(self, x: Tensor, start: int, stop: int) -> Tensor:
        rotation = _chunk_table(self.lo, self.hi, self.grid_width, start, stop)  # (n, d)
        if x.dim() == 5:
            rotation = rotation[:, None]
        pairs = torch.view_as_complex(x.contiguous().unflatten(-1, (-1, 2)))
        return torch.view_as_real(pairs * rotation).flatten(-2)


def _rotation(rope: Optional[RopeHalves], dtype: torch.dtype, tracing: bool) -> Optional[_RealRotation]:
    """The rotation of a call: none, the complex product in eager mode, real arithmetic under tracing."""
    if rope is None:
        return None
    return _RealRotation(rope, dtype) if tracing else _ComplexRotation(rope, dtype)


def _grid_chunk_size(chunk_size: int, grid_width: int) -> int:
    """``chunk_size`` rounded to whole grid rows (at least one row)."""
    return max(grid_width, chunk_size // grid_width * grid_width)


def pola_attention_torch(q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor,
                         rope: Union[Rope, RopeHalves] = None, eps: float = 1e-6,
                         chunk_size: Optional[int] = None) -> Tensor:
    """PyTorch implementation (no argument checks; see :func:`~polaformerpp.ops.pola_attention`).

    Two passes over the tokens, ``chunk_size`` at a time (default: about
    ``2**17 / (B h d)`` tokens), so every temporary is cache-sized and memory
    is linear in N:

    1. keys: ``S = sum_n R(phi_k)_n^T v_n / N`` (``(2d, dv)``, shared by both
       streams) and ``m = mean_n phi_k`` (``(2d,)``);
    2. queries: ``[phi_s, phi_o]`` built side by side (``(n, 2, 2d)``: one
       product with signed temperatures, one exp, one softshrink, one
       rotation for both); each stream reads its half of ``S``:
       ``num = R(phi) S_stream``, ``den = phi . m``.

    Feature maps are ``exp(x) - 1`` as the method defines them (vectorised exp;
    the inactive polarity is exactly zero). Where some exponent may leave the
    shift-free range (:func:`~.common.needs_exponent_shift`), both passes use
    the exponent shifts of :mod:`.common` instead: the same output, finite for
    any finite input. The RoPE angles of a chunk are sliced and broadcast
    (no gathers); the rotation is one complex product per channel pair, and
    under tracing real arithmetic (no complex tensors), so ONNX export and
    torch.compile see plain real tensor ops.
    Temperatures must be non-negative and RoPE tables must give both channels
    of a pair the same angle (both checked here, except under torch.compile or
    torch.jit.trace).

    Args:
        q, k: ``(B, h, N, d)``; v: ``(B, h, N, dv)``.
        temp_same, temp_opp: ``(h, 2d)``.
        rope: any form :func:`~polaformerpp.ops.pola_attention` accepts, or its
            :class:`~polaformerpp.ops.rope.RopeHalves`.

    Returns:
        Tensor: ``(B, h, N, dv)`` in ``q``'s dtype.
    """
    out_dtype = q.dtype
    dtype = compute_dtype(q.dtype)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    batch, heads, num_tokens, head_dim = q.shape
    half = v.shape[-1] // 2
    chunk_size = chunk_size or chunk_tokens(q)
    rope = as_rope_halves(rope, head_dim, q.device)
    tracing = is_tracing()
    # data-dependent checks cannot be traced (torch.compile, torch.jit.trace)
    if not tracing:
        check_temperatures(temp_same, temp_opp)
        check_rope_pairs(rope)
    rotate = _rotation(rope, dtype, tracing)
    if tracing:
        # one chunk: a Python loop over a symbolic token count would fix it (and H, W) in the graph
        chunks = [(0, num_tokens)]
    else:
        if rope is not None and rope.grid_width:
            chunk_size = _grid_chunk_size(chunk_size, rope.grid_width)
        chunks = token_chunks(num_tokens, chunk_size)
    # exponent shifts (see .common) only where some exponent may leave the shift-free range
    pairs = rope is not None  # rotated features need one shift per channel pair
    key_shifts = key_exponent_shifts(k, pairs) if needs_exponent_shift(q, k, temp_same, temp_opp) else None

    # the chunks as one split each (under autograd one backward node apiece, which joins the
    # chunks' gradients in one pass; slices would each fill a full-size zero gradient)
    sizes = [stop - start for start, stop in chunks]
    q_chunks, k_chunks, v_chunks = (t.split(sizes, dim=-2) for t in (q, k, v))

    # pass 1: keys -> state S and mean feature m
    state, key_sum = 0, 0
    for (start, stop), k_chunk, v_chunk in zip(chunks, k_chunks, v_chunks):
        phi_k = _key_features(k_chunk) if key_shifts is None else _shifted_key_features(k_chunk, key_shifts)
        key_sum = key_sum + phi_k.sum(dim=-2)  # (B, h, 2d)
        if rotate is not None:
            phi_k = rotate(phi_k, start, stop)
        state = state + phi_k.transpose(-1, -2) @ v_chunk
    state = state / num_tokens  # (B, h, 2d, dv); 1/N in the compute dtype
    key_mean = key_sum / num_tokens  # (B, h, 2d)
    if key_shifts is not None:  # the queries take the keys' scale: m'' <= 1
        key_divisor, log_scale = key_normalisation(key_shifts, key_mean, pairs)
        state = state / key_divisor[..., None]
        key_mean = key_mean / key_divisor
        log_rows, log_mean_rows = signed_rows(log_scale), signed_rows(key_mean.detach().log())
    key_mean = key_mean[:, :, None, :, None]  # (B, h, 1, 2d, 1)
    state_same, state_opp = state[..., :half], state[..., half:]

    # pass 2: queries -> both streams at once
    signed_temps = signed_temperatures(temp_same.to(dtype), temp_opp.to(dtype))
    outs = []
    for (start, stop), q_chunk in zip(chunks, q_chunks):
        if key_shifts is None:
            phi_q = _query_features(q_chunk, signed_temps)  # (B, h, n, 2, 2d)
            eps_term = eps
        else:
            exponents = q_chunk.unsqueeze(-2) * signed_temps[None, :, None]  # (B, h, n, 4, d)
            query_shifts = query_exponent_shifts(exponents, log_rows, log_mean_rows)  # (B, h, n, 2)
            phi_q = _shifted_query_features(exponents, log_rows, query_shifts)
            eps_term = shifted_eps(eps, query_shifts)[..., None]  # (B, h, n, 2, 1)
        den = phi_q @ key_mean + eps_term  # (B, h, n, 2, 1)
        if rotate is not None:
            # angles rebuilt rather than kept from pass 1: (N, d) tables per call would
            # cost more in fresh memory than rebuilding a chunk's angles costs
            phi_q = rotate(phi_q, start, stop)
        num = torch.stack([phi_q[..., 0, :] @ state_same, phi_q[..., 1, :] @ state_opp], dim=-2)
        outs.append((num / den).flatten(-2))  # (B, h, n, dv)
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)
    return out.to(out_dtype)
