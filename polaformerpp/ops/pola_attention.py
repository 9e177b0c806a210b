"""Polarity-aware linear attention with channel-wise spiky feature maps.

For one head with queries ``q``, keys ``k`` (``N x d``) and values ``v``
(``N x dv``), with ``x+ = relu(x)``, ``x- = relu(-x)`` and temperatures ``ts``,
``to`` in (0, 1) of ``2d`` channels::

    phi_s = exp([q+, q-] * ts) - 1        same-polarity queries   (N, 2d)
    phi_o = exp([q-, q+] * to) - 1        opposite-polarity queries
    phi_k = exp([k+, k-]) - 1             keys, shared by both streams

    S = R(phi_k)^T v / N                  (2d, dv): one state for both streams
    m = mean_N(phi_k)                     (2d,)
    out_same = R(phi_s) S[:, :dv/2] / (phi_s m + eps)
    out_opp  = R(phi_o) S[:, dv/2:] / (phi_o m + eps)
    out = [out_same | out_opp]            (N, dv)

``R`` is the optional 2-D rotary embedding (numerator only). The cost is
``O(N d dv)``; no ``N x N`` matrix is ever formed.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor



__all__ = ['pola_attention', 'pola_attention_torch', 'pola_feature_maps', 'available_backends']

_BACKENDS = ('auto', 'torch', 'triton')


def available_backends() -> Tuple[str, ...]:
    """Backends usable in this process (``'triton'`` needs a CUDA device and Triton)."""
    backends = ['torch']
    if _triton_usable():
        backends.append('triton')
    return tuple(backends)


def _triton_usable() -> bool:
    try:
        from . import pola_attention_triton  # noqa: F401
    except ImportError:
        return False
    return True


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # fp16/bf16 inputs are computed in fp32 (exp overflows fp16 at 11.1, 1/N
    # underflows it at long sequences); fp64 stays fp64 (gradcheck).
    return torch.float64 if dtype == torch.float64 else torch.float32


def pola_feature_maps(q: Tensor, k: Tensor, temp_same: Tensor,
                      temp_opp: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """Polarity-aware, channel-wise spiky feature maps.

    Args:
        q, k: ``(B, h, N, d)``.
        temp_same, temp_opp: ``(h, 2d)`` temperatures in (0, 1).

    Returns:
        tuple[Tensor, Tensor, Tensor]: ``phi_s``, ``phi_o``, ``phi_k``, each
        ``(B, h, N, 2d)`` and non-negative.
    """
    q_pos, q_neg = F.relu(q), F.relu(-q)
    k_pos, k_neg = F.relu(k), F.relu(-k)
    ts = temp_same[None, :, None, :]
    to = temp_opp[None, :, None, :]
    phi_s = torch.expm1(torch.cat([q_pos, q_neg], dim=-1) * ts)
    phi_o = torch.expm1(torch.cat([q_neg, q_pos], dim=-1) * to)
    phi_k = torch.expm1(torch.cat([k_pos, k_neg], dim=-1))
    return phi_s, phi_o, phi_k


_TOKEN_CHUNK = 4096  # tokens per step of the torch backend (keeps temporaries cache-sized)


def _rotate_pairs(x: Tensor, sin_alt: Tensor, cos: Tensor) -> Tensor:
    """RoPE with a pre-signed sine: ``x * cos + swap_pairs(x) * sin_alt``.

    ``sin_alt`` holds ``-sin`` on even and ``+sin`` on odd channels, so a pair
    ``(x0, x1)`` becomes ``(x0 cos - x1 sin, x1 cos + x0 sin)``, as in
    :func:`polaformerpp.ops.rope.apply_rope`.
    """
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return torch.addcmul(x * cos, swapped, sin_alt)


def pola_attention_torch(q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor,
                         rope: Optional[Tuple[Tensor, Tensor]] = None, eps: float = 1e-6,
                         chunk_size: int = _TOKEN_CHUNK) -> Tensor:
    """PyTorch implementation (no argument checks; see :func:`pola_attention`).

    Two passes over the tokens, ``chunk_size`` at a time, so every temporary
    is ``O(chunk * d)`` and stays in cache:

    1. keys: ``S = sum_n R(phi_k)_n^T v_n / N`` (``(2d, dv)``, shared by both
       streams) and ``m = mean_n phi_k`` (``(2d,)``);
    2. queries: both streams' feature maps built side by side, ``phi_q =
       [phi_s | phi_o]`` (``(n, 4d)``, one ``expm1`` and one rotation for
       both); each stream then reads its half: ``num = R(phi) S_stream``,
       ``den = phi . m``.
    """
    out_dtype = q.dtype
    dtype = _compute_dtype(q.dtype)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    num_tokens, head_dim = q.shape[-2:]
    half = v.shape[-1] // 2
    ts = temp_same.to(dtype)[None, :, None, :]
    to = temp_opp.to(dtype)[None, :, None, :]
    if rope is not None:
        sin, cos = (t.to(dtype) for t in rope)
        sin_alt = sin * torch.tensor([-1.0, 1.0], dtype=dtype, device=sin.device).repeat(sin.shape[-1] // 2)

    # pass 1: keys -> state S and mean feature m
    state, key_sum = 0, 0
    for start in range(0, num_tokens, chunk_size):
        stop = min(start + chunk_size, num_tokens)
        k_chunk = k[..., start:stop, :]
        phi_k = torch.expm1(torch.cat([F.relu(k_chunk), F.relu(-k_chunk)], dim=-1))  # (B, h, n, 2d)
        key_sum = key_sum + phi_k.sum(dim=-2)
        if rope is not None:
            phi_k = _rotate_pairs(phi_k, sin_alt[start:stop], cos[start:stop])
        state = state + phi_k.transpose(-1, -2) @ v[..., start:stop, :]
    state = state / num_tokens  # (B, h, 2d, dv); 1/N in the compute dtype
    key_mean = (key_sum / num_tokens)[..., None]  # (B, h, 2d, 1)
    state_same, state_opp = state[..., :half], state[..., half:]
    if rope is not None:
        sin_alt, cos = torch.cat([sin_alt, sin_alt], dim=-1), torch.cat([cos, cos], dim=-1)

    # pass 2: queries -> both streams at once
    d = head_dim
    two_d = 2 * head_dim
    outs = []
    for start in range(0, num_tokens, chunk_size):
        stop = min(start + chunk_size, num_tokens)
        q_chunk = q[..., start:stop, :]
        q_pos, q_neg = F.relu(q_chunk), F.relu(-q_chunk)
        phi_q = torch.expm1(torch.cat([q_pos * ts[..., :d], q_neg * ts[..., d:],  # phi_s
                                       q_neg * to[..., :d], q_pos * to[..., d:]], dim=-1))  # phi_o
        den_same = phi_q[..., :two_d] @ key_mean + eps  # (B, h, n, 1)
        den_opp = phi_q[..., two_d:] @ key_mean + eps
        if rope is not None:
            phi_q = _rotate_pairs(phi_q, sin_alt[start:stop], cos[start:stop])
        out_same = phi_q[..., :two_d] @ state_same / den_same  # (B, h, n, dv/2)
        out_opp = phi_q[..., two_d:] @ state_opp / den_opp
        outs.append(torch.cat([out_same, out_opp], dim=-1))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)
    return out.to(out_dtype)


def _check_inputs(q, k, v, temp_same, temp_opp, rope, eps, backend):
    for name, t in (('q', q), ('k', k), ('v', v), ('temp_same', temp_same), ('temp_opp', temp_opp)):
        if not isinstance(t, Tensor):
            raise TypeError(f'{name} must be a torch.Tensor, got {type(t).__name__}')
        if not t.is_floating_point():
            raise TypeError(f'{name} must be a floating-point tensor, got dtype {t.dtype}')
    if q.dim() != 4:
        raise ValueError(f'q must have shape (B, h, N, d), got rank {q.dim()} shape {tuple(q.shape)}')
    if k.shape != q.shape:
        raise ValueError(f'k must have the shape of q {tuple(q.shape)}, got {tuple(k.shape)}')
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f'v must have shape (B, h, N, dv) with (B, h, N) = {tuple(q.shape[:3])}, '
                         f'got {tuple(v.shape)}')
    num_heads, num_tokens, head_dim = q.shape[1], q.shape[2], q.shape[3]
    if head_dim % 2 != 0:
        raise ValueError(f'the head dim of q/k (last dim) must be even, got {head_dim}')
    if v.shape[-1] % 2 != 0:
        raise ValueError(f'the head dim of v (last dim) must be even to split it into the '
                         f'two polarity streams, got {v.shape[-1]}')
    if num_tokens < 1:
        raise ValueError(f'q must hold at least one token (N >= 1), got N={num_tokens}')
    for name, t in (('temp_same', temp_same), ('temp_opp', temp_opp)):
        if tuple(t.shape) != (num_heads, 2 * head_dim):
            raise ValueError(f'{name} must have shape (h, 2d) = {(num_heads, 2 * head_dim)}, '
                             f'got {tuple(t.shape)}')
    if rope is not None:
        if not isinstance(rope, (tuple, list)) or len(rope) != 2:
            raise TypeError('rope must be None or a (sin, cos) pair of tensors')
        for name, t in zip(('rope[0] (sin)', 'rope[1] (cos)'), rope):
            if not isinstance(t, Tensor) or not t.is_floating_point():
                raise TypeError(f'{name} must be a floating-point tensor')
            if tuple(t.shape) != (num_tokens, 2 * head_dim):
                raise ValueError(f'{name} must have shape (N, 2d) = {(num_tokens, 2 * head_dim)}, '
                                 f'got {tuple(t.shape)}')
    if not isinstance(eps, (int, float)) or eps < 0:
        raise ValueError(f'eps must be a non-negative number, got {eps!r}')
    if backend not in _BACKENDS:
        raise ValueError(f'backend must be one of {_BACKENDS}, got {backend!r}')


def pola_attention(q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor,
                   rope: Optional[Tuple[Tensor, Tensor]] = None, eps: float = 1e-6,
                   backend: str = 'auto') -> Tensor:
    """Polarity-aware linear attention, both streams at once.

    Args:
        q, k: ``(B, h, N, d)``, ``d`` even.
        v: ``(B, h, N, dv)``, ``dv`` even (``dv == d`` in every model here).
        temp_same, temp_opp: ``(h, 2d)`` channel-wise temperatures, already
            passed through a sigmoid.
        rope: ``None`` or ``(sin, cos)``, each ``(N, 2d)`` (see
            :func:`pola_rope_tables`); applied to the numerator only.
        eps: added to the denominator.
        backend: ``'torch'``, ``'triton'`` (CUDA tensors) or ``'auto'`` (the
            fastest one usable for these tensors; never fails on CPU).

    Returns:
        Tensor: ``(B, h, N, dv)`` in ``q``'s dtype: ``[same-polarity stream
        over v[..., :dv/2] | opposite-polarity stream over v[..., dv/2:]]``.
        Feature maps and accumulation are fp32 for fp16/bf16 inputs.
    """
    _check_inputs(q, k, v, temp_same, temp_opp, rope, eps, backend)
    if backend == 'auto':
        fused_ok = (q.is_cuda and v.shape[-1] == q.shape[-1]
                    and all(t.dtype in (torch.float32, torch.float16, torch.bfloat16) for t in (q, k, v)))
        backend = 'triton' if fused_ok and _triton_usable() else 'torch'
    if backend == 'triton':
        if not _triton_usable():
            raise ValueError("backend='triton' is not available in this build: "
                             "use backend='torch' or 'auto'")
        from .pola_attention_triton import pola_attention_triton
        return pola_attention_triton(q, k, v, temp_same, temp_opp, rope, eps)
    return pola_attention_torch(q, k, v, temp_same, temp_opp, rope, eps)
