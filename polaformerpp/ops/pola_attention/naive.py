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
"""
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ..rope import RopeGrid, apply_rope, pola_rope_tables
from .common import compute_dtype

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


def pola_attention_weights(q: Tensor, k: Tensor, temp_same: Tensor, temp_opp: Tensor,
                           rope: Union[None, RopeGrid, Tuple[Tensor, Tensor]] = None, eps: float = 1e-6,
                           query_index: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """The ``N x N`` matrices the attention applies to the two value halves.

    ``W_s[i, j] = <R phi_s[i], R phi_k[j]> / (N (<phi_s[i], mean_j phi_k[j]> + eps))``
    (``W_opp`` with ``phi_o``; ``R`` the RoPE, identity without it).

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
    phi_s, phi_o, phi_k = pola_feature_maps(q, k, temp_same.to(q.dtype), temp_opp.to(q.dtype))
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
    weights = []
    for phi_q, rot_q in ((phi_s, rot_s), (phi_o, rot_o)):
        denominator = (phi_q * key_mean).sum(-1, keepdim=True) + eps  # (B, h, Nq, 1)
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
