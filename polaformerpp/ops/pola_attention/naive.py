"""The readable reference of the polarity-aware linear attention, in plain torch.

Two forms of the method of :mod:`polaformerpp.ops.pola_attention` (see its
docstring for the equations):

* the quadratic form, through the ``N x N`` weights each query gives every key
  (:func:`pola_attention_weights`, :func:`naive_pola_attention_quadratic`),
  which the analysis tools read and the tests hold the backends to in float64;
* the linear form as the authors' code writes it (:func:`naive_pola_attention`:
  separate relu/cat/exp tensors, ``K^T V`` first), the "naive" column of
  ``tools/analysis_tools/benchmark_attention.py``.

Every function works in the dtype it is given (float64 included); only
:func:`naive_pola_attention` computes fp16/bf16 inputs in fp32, as the op does.

The quadratic form applies the backends' exponent shifts (see
:mod:`.common`) where the inputs need them, so its weights stay finite for
any finite ``q`` and ``k``; :func:`pola_feature_maps` and
:func:`naive_pola_attention` are the unshifted definitions and overflow
like ``exp`` does.
"""
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ..rope import RopeGrid, apply_rope, pola_rope_tables
from .common import (
    MAX_QUERY_EXPONENT,
    SHIFT_FREE_PRODUCT_EXPONENT,
    compute_dtype,
    key_exponent_shifts,
    key_normalisation,
    needs_exponent_shift,
    shifted_eps,
)

__all__ = ['pola_feature_maps', 'pola_attention_weights', 'naive_pola_attention_quadratic',
           'naive_pola_attention']

Tables = Optional[Tuple[Tensor, Tensor]]


def _as_tables(rope: Union[None, RopeGrid, Tuple[Tensor, Tensor]], head_dim: int, device) -> Tables:
    """``(sin, cos)`` ``(N, 2d)`` for a :class:`RopeGrid` (fp32, :func:`pola_rope_tables`); tables as given."""
    if isinstance(rope, RopeGrid):
        return pola_rope_tables(*rope, head_dim, device=device)
    return rope


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


def _exponent_maps(q: Tensor, k: Tensor, temp_same: Tensor, temp_opp: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """The arguments of ``exp`` in :func:`pola_feature_maps` (``phi = exp(x) - 1`` where ``x > 0``, else 0)."""
    q_pos, q_neg = F.relu(q), F.relu(-q)
    x_s = torch.cat([q_pos, q_neg], dim=-1) * temp_same[None, :, None, :]
    x_o = torch.cat([q_neg, q_pos], dim=-1) * temp_opp[None, :, None, :]
    return x_s, x_o, torch.cat([F.relu(k), F.relu(-k)], dim=-1)


def _shifted_feature_maps(q: Tensor, k: Tensor, temp_same: Tensor, temp_opp: Tensor, eps: float,
                          pairs: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Feature maps scaled so that nothing overflows, and each query stream's ``eps``.

    Keys: ``phi_k'' = (exp(x - b) - exp(-b)) / r``; each query stream:
    ``phi'' = exp(x + L - c) - exp(L - c)`` with ``L = b + log r`` and the
    per-token ``c`` of :mod:`.common`; ``eps'' = eps * exp(-c)``. Every
    weight ``<R phi_q'', R phi_k''> / (N (phi_q'' . m'' + eps''))`` equals the
    unshifted one. ``pairs``: RoPE pairs share their key shifts and divisors.

    Returns:
        tuple: ``phi_s``, ``phi_o``, ``phi_k`` ``(B, h, N, 2d)``, ``eps_s``, ``eps_o`` ``(B, h, N, 1)``.
    """
    x_s, x_o, x_k = _exponent_maps(q, k, temp_same, temp_opp)
    shifts = key_exponent_shifts(k, pairs)[:, :, None, :]  # (B, h, 1, 2d)
    phi_k = torch.exp(x_k - shifts) * -torch.expm1(-x_k)  # exp(x - b) - exp(-b), no cancellation
    divisor, log_scale = key_normalisation(shifts[:, :, 0], phi_k.mean(dim=-2), pairs)
    phi_k = phi_k / divisor[:, :, None, :]
    log_scale = log_scale[:, :, None, :]
    log_mean = phi_k.mean(dim=-2, keepdim=True).detach().log()
    maps, eps_terms = [], []
    for x in (x_s, x_o):
        scaled = x.detach() + log_scale
        top_term = (scaled + log_mean).amax(dim=-1, keepdim=True)
        top_feature = scaled.amax(dim=-1, keepdim=True)
        shift = torch.maximum((top_term - SHIFT_FREE_PRODUCT_EXPONENT).clamp_min(0),
                              top_feature - MAX_QUERY_EXPONENT)  # (B, h, N, 1)
        maps.append(torch.exp(x + log_scale - shift) * -torch.expm1(-x))  # exp(x + L - c) - exp(L - c)
        eps_terms.append(shifted_eps(eps, shift))
    return maps[0], maps[1], phi_k, eps_terms[0], eps_terms[1]


def pola_attention_weights(q: Tensor, k: Tensor, temp_same: Tensor, temp_opp: Tensor,
                           rope: Union[None, RopeGrid, Tuple[Tensor, Tensor]] = None, eps: float = 1e-6,
                           query_index: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """The ``N x N`` matrices the attention applies to the two value halves.

    ``W_s[i, j] = <R phi_s[i], R phi_k[j]> / (N (<phi_s[i], mean_j phi_k[j]> + eps))``
    (``W_opp`` with ``phi_o``; ``R`` the RoPE, identity without it). Inputs
    whose exponents leave the shift-free range are computed with the exponent
    shifts of :mod:`.common` (the same weights, without overflow).

    Args:
        q, k: ``(B, h, N, d)``.
        temp_same, temp_opp: ``(h, 2d)`` temperatures (after the sigmoid); cast to ``q``'s dtype.
        rope: ``None``, ``(sin, cos)`` ``(N, 2d)`` (:func:`pola_rope_tables`; cast to ``q``'s
            dtype) or a :class:`RopeGrid` (the same tables).
        eps: the op's denominator epsilon.
        query_index: rows (queries) to return; all by default.

    Returns:
        tuple[Tensor, Tensor]: ``W_same``, ``W_opp``, each ``(B, h, Nq, N)``, with
        ``W_same @ v[..., :dv/2]`` and ``W_opp @ v[..., dv/2:]`` equal to the two
        halves of :func:`~polaformerpp.ops.pola_attention`'s output at those queries.
    """
    temp_same, temp_opp = temp_same.to(q.dtype), temp_opp.to(q.dtype)
    if needs_exponent_shift(q, k, temp_same, temp_opp):
        phi_s, phi_o, phi_k, eps_s, eps_o = _shifted_feature_maps(q, k, temp_same, temp_opp, eps, rope is not None)
    else:
        phi_s, phi_o, phi_k = pola_feature_maps(q, k, temp_same, temp_opp)
        eps_s = eps_o = eps
    num_keys = k.shape[-2]
    key_mean = phi_k.mean(dim=-2, keepdim=True)  # (B, h, 1, 2d)
    rope = _as_tables(rope, q.shape[-1], q.device)
    if rope is not None:
        sin, cos = (t.to(q.dtype) for t in rope)
        rot_s, rot_o, rot_k = (apply_rope(x, sin, cos) for x in (phi_s, phi_o, phi_k))
    else:
        rot_s, rot_o, rot_k = phi_s, phi_o, phi_k
    if query_index is not None:
        phi_s, phi_o = phi_s[..., query_index, :], phi_o[..., query_index, :]
        rot_s, rot_o = rot_s[..., query_index, :], rot_o[..., query_index, :]
        eps_s, eps_o = (e[..., query_index, :] if isinstance(e, Tensor) else e for e in (eps_s, eps_o))
    weights = []
    for phi_q, rot_q, eps_q in ((phi_s, rot_s, eps_s), (phi_o, rot_o, eps_o)):
        denominator = (phi_q * key_mean).sum(-1, keepdim=True) + eps_q  # (B, h, Nq, 1)
        weights.append((rot_q @ rot_k.transpose(-1, -2)) / (num_keys * denominator))
    return weights[0], weights[1]


def naive_pola_attention_quadratic(q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor,
                                   rope: Union[None, RopeGrid, Tuple[Tensor, Tensor]] = None,
                                   eps: float = 1e-6) -> Tensor:
    """The attention through its ``N x N`` weights (:func:`pola_attention_weights`); ``O(N^2)``.

    Args:
        q, k: ``(B, h, N, d)``; v: ``(B, h, N, dv)``, ``dv`` even.
        temp_same, temp_opp, rope, eps: as :func:`pola_attention_weights`.

    Returns:
        Tensor: ``(B, h, N, dv)`` in ``q``'s dtype (pass float64 for a reference).
    """
    half = v.shape[-1] // 2
    w_same, w_opp = pola_attention_weights(q, k, temp_same, temp_opp, rope, eps)
    return torch.cat([w_same @ v[..., :half], w_opp @ v[..., half:]], dim=-1)


def naive_pola_attention(q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor,
                         rope: Union[None, RopeGrid, Tuple[Tensor, Tensor]] = None,
                         eps: float = 1e-6) -> Tensor:
    """The linear form as the authors' code writes it (``K^T V`` first, ``O(N d dv)``).

    Separate relu/cat/exp tensors, RoPE on the full ``(N, 2d)`` feature maps and
    both streams' products one after the other: what the fused backends are
    measured against. fp16/bf16 inputs are computed in fp32, fp32 and fp64 in
    their own dtype; the output has ``q``'s dtype.

    Args:
        q, k: ``(B, h, N, d)``; v: ``(B, h, N, dv)``, ``dv`` even.
        temp_same, temp_opp: ``(h, 2d)`` temperatures (after the sigmoid).
        rope: ``None``, ``(sin, cos)`` ``(N, 2d)`` or a :class:`RopeGrid`.
        eps: added to the denominator.

    Returns:
        Tensor: ``(B, h, N, dv)``.
    """
    dtype = q.dtype
    work = compute_dtype(dtype)
    q, k, v = q.to(work), k.to(work), v.to(work)
    num_tokens = q.shape[-2]
    rope = _as_tables(rope, q.shape[-1], q.device)
    q_pos, q_neg = F.relu(q), F.relu(-q)
    k_pos, k_neg = F.relu(k), F.relu(-k)
    q_sim = torch.cat([q_pos, q_neg], dim=-1)
    q_opp = torch.cat([q_neg, q_pos], dim=-1)
    k_cat = torch.cat([k_pos, k_neg], dim=-1)
    q_sim = torch.exp(q_sim * temp_same[None, :, None, :]) - 1
    q_opp = torch.exp(q_opp * temp_opp[None, :, None, :]) - 1
    k_cat = torch.exp(k_cat) - 1
    v1, v2 = torch.chunk(v, 2, dim=-1)

    k_mean = k_cat.mean(dim=-2, keepdim=True)
    z_sim = 1 / (q_sim @ k_mean.transpose(-2, -1) + eps)
    z_opp = 1 / (q_opp @ k_mean.transpose(-2, -1) + eps)
    if rope is not None:
        sin, cos = rope
        q_sim = apply_rope(q_sim, sin, cos)
        q_opp = apply_rope(q_opp, sin, cos)
        k_cat = apply_rope(k_cat, sin, cos)
    scale = num_tokens ** -0.5
    kv_sim = (k_cat.transpose(-2, -1) * scale) @ (v1 * scale)
    kv_opp = (k_cat.transpose(-2, -1) * scale) @ (v2 * scale)
    x_sim = q_sim @ kv_sim * z_sim
    x_opp = q_opp @ kv_opp * z_opp
    return torch.cat([x_sim, x_opp], dim=-1).to(dtype)
