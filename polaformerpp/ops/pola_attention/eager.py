"""Eager, chunked PyTorch backend of :func:`~polaformerpp.ops.pola_attention` (``backend='torch'``).

Differentiable (autograd through plain torch ops), any floating dtype, and
what torch.compile, torch.jit.trace and the FLOP counter see. The method is
written out in the package docstring.
"""
from typing import Callable, Optional, Union

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


def _pair_rotations(sin: Tensor, cos: Tensor, dtype: torch.dtype) -> Tensor:
    """``(rows, c)`` tables -> unit complex numbers ``(rows, c/2)``, one per channel pair."""
    return torch.complex(cos[:, 0::2].to(dtype), sin[:, 0::2].to(dtype))


def _rotation_source(rope: Optional[RopeHalves], dtype: torch.dtype,
                     device: torch.device) -> Optional[Callable[[int, int], Tensor]]:
    """``rotation(start, stop)``: the complex rotations ``(stop - start, d)`` of those tokens.

    A grid's row and column rotations (``(H, d/2)``, ``(W, d/2)``) are built
    once and gathered per chunk; ``(N, d)`` table halves are read chunk by chunk.
    """
    if rope is None:
        return None
    if rope.grid_width:
        lo = _pair_rotations(rope.sin_lo, rope.cos_lo, dtype)
        hi = _pair_rotations(rope.sin_hi, rope.cos_hi, dtype)

        def rotation(start, stop):
            tokens = torch.arange(start, stop, device=device)
            return torch.cat([lo[tokens // rope.grid_width], hi[tokens % rope.grid_width]], dim=-1)
        return rotation

    def rotation(start, stop):
        return torch.cat([_pair_rotations(rope.sin_lo[start:stop], rope.cos_lo[start:stop], dtype),
                          _pair_rotations(rope.sin_hi[start:stop], rope.cos_hi[start:stop], dtype)], dim=-1)
    return rotation


def _rotate(x: Tensor, rotation: Tensor) -> Tensor:
    """RoPE of channel pairs as a complex product: ``(x0 + i x1) * (cos + i sin)``.

    Args:
        x: ``(..., 2c)`` real, contiguous.
        rotation: complex, broadcastable to ``(..., c)``.
    """
    return torch.view_as_real(torch.view_as_complex(x.unflatten(-1, (-1, 2))) * rotation).flatten(-2)


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
       product with signed temperatures, one exp, one softshrink, one complex
       rotation for both); each stream reads its half of ``S``:
       ``num = R(phi) S_stream``, ``den = phi . m``.

    Feature maps are ``exp(x) - 1`` as the method defines them (vectorised exp;
    the inactive polarity is exactly zero). Temperatures must be non-negative
    and RoPE tables must give both channels of a pair the same angle
    (both checked here, except under torch.compile or torch.jit.trace).

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
    # data-dependent checks cannot be traced (torch.compile, torch.jit.trace)
    if not is_tracing():
        check_temperatures(temp_same, temp_opp)
        check_rope_pairs(rope)
    rotation = _rotation_source(rope, dtype, q.device)
    chunks = token_chunks(num_tokens, chunk_size)

    # pass 1: keys -> state S and mean feature m
    state, key_sum = 0, 0
    for start, stop in chunks:
        phi_k = _key_features(k[..., start:stop, :])  # (B, h, n, 2d)
        key_sum = key_sum + phi_k.sum(dim=-2)
        if rotation is not None:
            phi_k = _rotate(phi_k, rotation(start, stop))
        state = state + phi_k.transpose(-1, -2) @ v[..., start:stop, :]
    state = state / num_tokens  # (B, h, 2d, dv); 1/N in the compute dtype
    key_mean = (key_sum / num_tokens)[:, :, None, :, None]  # (B, h, 1, 2d, 1)
    state_same, state_opp = state[..., :half], state[..., half:]

    # pass 2: queries -> both streams at once
    signed_temps = signed_temperatures(temp_same.to(dtype), temp_opp.to(dtype))
    out = q.new_empty(batch, heads, num_tokens, 2 * half)
    for start, stop in chunks:
        phi_q = _query_features(q[..., start:stop, :], signed_temps)  # (B, h, n, 2, 2d)
        den = phi_q @ key_mean + eps  # (B, h, n, 2, 1)
        if rotation is not None:
            # rebuilt rather than kept from pass 1: an (N, d) complex tensor per call
            # would cost more in fresh memory than the gather costs
            phi_q = _rotate(phi_q, rotation(start, stop)[:, None, :])
        num = torch.stack([phi_q[..., 0, :] @ state_same, phi_q[..., 1, :] @ state_opp], dim=-2)
        out[..., start:stop, :] = (num / den).flatten(-2)  # (B, h, n, dv)
    return out.to(out_dtype)
