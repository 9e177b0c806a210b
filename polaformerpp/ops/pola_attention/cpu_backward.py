"""Training on the fused CPU backend: its forward under autograd, with an analytic backward.

:class:`PolaAttentionCPU` runs the forward through the compiled kernels
(:mod:`.cpu`) and keeps only ``q``, ``k``, ``v``, the output, the state ``S``
and the key mean ``m``. Its backward takes the method's derivatives in closed
form (notation of the package docstring; one head, stream ``s`` with query
features ``phi`` (``phi_s`` or ``phi_o``), value half ``S_s``, output ``o_s``
and output gradient ``g_s``)::

    den     = phi m + eps,   dden = -(g_s . o_s) / den
    dphi    = R^T(g_s S_s^T) / den + dden m      (R^T: the opposite rotation)
    dS_s    = sum_n (R(phi) / den)^T g_s,        dm = sum_n,s dden phi
    dphi_k  = R^T(v dS^T) / N + dm / N,          dv = R(phi_k) dS / N

and through ``phi = exp(relu(x)) - 1`` (slope ``phi + 1`` on the active
exponents, zero elsewhere) to ``q``, ``k`` and the temperatures. Two passes,
queries then keys. By default each pass is one kernel (``query_backward``,
``key_backward``): per block of tokens and head on one thread it rebuilds the
feature rows in a buffer, runs the products with them there (sgemm) and
finishes every row's derivatives while the block is in cache (vector rows for
head dims that are a multiple of 8, scalar rows otherwise). With a
``chunk_size`` the passes go over token chunks instead: the kernels rebuild
the feature rows (``query_features``, ``key_features``) and finish every
row's derivatives (``query_grads``, ``key_grads``), and the four products
between them are batched matmuls. Autograd of the eager backend instead
records several dozen elementwise operations per chunk and keeps their
results.

It serves inputs in the shift-free exponent range (:func:`~.common.needs_exponent_shift`
is false, the case of trained networks); the dispatcher sends the others to
the eager backend, whose autograd follows the exponent shifts.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..rope import RopeHalves
from .common import chunk_tokens, signed_temperatures, token_chunks
from .cpu import float_rows, kernels, pola_attention_cpu_with_state, rope_rows_for_kernels

__all__ = ['PolaAttentionCPU', 'pola_attention_cpu_trainable']


class PolaAttentionCPU(torch.autograd.Function):
    """``pola_attention`` on the fused CPU kernels, differentiable in ``q, k, v`` and both temperatures.

    Forward arguments as :func:`~.cpu.pola_attention_cpu_with_state` (``rope``
    a :class:`~polaformerpp.ops.rope.RopeHalves` or None); the RoPE tables get no
    gradient. Only for inputs in the shift-free exponent range (the caller
    checks :func:`~.common.needs_exponent_shift`); first derivatives only.
    """

    @staticmethod
    def forward(ctx, q, k, v, temp_same, temp_opp, rope, eps):
        out, state, key_mean, _ = pola_attention_cpu_with_state(q, k, v, temp_same, temp_opp, rope, eps,
                                                                shifted=False)
        ctx.rope, ctx.eps = rope, eps
        ctx.save_for_backward(q, k, v, temp_same, temp_opp, out, state, key_mean)
        return out

    @staticmethod
    @once_differentiable  # the kernels record no graph: a second derivative raises a clear error
    def backward(ctx, grad_out):
        q, k, v, temp_same, temp_opp, out, state, key_mean = ctx.saved_tensors
        grads = pola_attention_cpu_backward(grad_out, q, k, v, temp_same, temp_opp, out, state, key_mean,
                                            ctx.rope, ctx.eps)
        return (*grads, None, None)


def pola_attention_cpu_trainable(q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor,
                                 rope: Optional[RopeHalves] = None, eps: float = 1e-6) -> Tensor:
    """The fused CPU forward with :class:`PolaAttentionCPU`'s backward (inputs in the shift-free range)."""
    return PolaAttentionCPU.apply(q, k, v, temp_same, temp_opp, rope, eps)


def pola_attention_cpu_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor,
                                temp_opp: Tensor, out: Tensor, state: Tensor, key_mean: Tensor,
                                rope: Optional[RopeHalves], eps: float, chunk_size: Optional[int] = None,
                                grad_qkv: Optional[Tuple[Tensor, Tensor, Tensor]] = None):
    """Gradients of ``q, k, v, temp_same, temp_opp`` (each in its input's dtype).

    Per token chunk, queries then keys: the compiled kernels rebuild the
    feature rows and finish each row's derivatives, the products between
    them (``dS``, ``g S^T``, ``dv``, ``v dS^T``) are batched matmuls.

    Args:
        grad_out, out: ``(B, h, N, dv)``; q, k: ``(B, h, N, d)``; v: ``(B, h, N, dv)``.
        temp_same, temp_opp: ``(h, 2d)``.
        state: ``(B, h, 2d, dv)`` and key_mean ``(B, h, 2d)``, fp32, from the forward (unshifted).
        chunk_size: tokens per step of the chunked passes; by default (None) the block-fused passes
            (``query_backward``, ``key_backward``) run instead, or, on kernels built without them,
            chunks of :func:`~.common.chunk_tokens`.
        grad_qkv: fp32 tensors shaped like ``q, k, v`` (any strides with a contiguous
            last dim, e.g. views of one packed gradient) that receive the gradients of
            ``q, k, v``; fresh tensors by default.
    """
    dtypes = [t.dtype for t in (q, k, v, temp_same, temp_opp)]
    q, k, v, grad_out, out = (float_rows(t) for t in (q, k, v, grad_out, out))
    batch, heads, num_tokens, head_dim = q.shape
    half = v.shape[-1] // 2
    chunks = token_chunks(num_tokens, chunk_size or chunk_tokens(q))
    rope_rows = rope_rows_for_kernels(rope)
    signed_temps = signed_temperatures(temp_same.detach().float(), temp_opp.detach().float()).contiguous()
    key_mean = key_mean.contiguous()
    state_t = state.transpose(-1, -2)  # (B, h, dv, 2d)

    grad_q, grad_k, grad_v = grad_qkv if grad_qkv is not None else (q.new_empty(q.shape), k.new_empty(k.shape),
                                                                    v.new_empty(v.shape))
    if chunk_size is None and hasattr(kernels, 'query_backward'):
        # both passes block-fused in the kernels (vector or scalar rows): nothing per chunk reaches memory
        rows = rope_rows(0, num_tokens)[:5]
        grad_state, mean_parts, temp_parts = kernels.query_backward(
            q, signed_temps, key_mean, state.contiguous(), *rows, float(eps), grad_out, out, grad_q)
        grad_state = grad_state.div_(num_tokens).contiguous()
        grad_mean = (mean_parts.sum(2) / num_tokens).contiguous()
        kernels.key_backward(k, v, grad_state, grad_mean, *rows, grad_k, grad_v)
        return _temperature_grads(grad_q, grad_k, grad_v, temp_parts.sum(dim=(0, 2)), dtypes)

    # pass 1, queries: dq, dS, dm and d(signed temps)
    grad_state = torch.zeros_like(state)
    grad_mean = torch.zeros_like(key_mean)
    grad_temps = torch.zeros_like(signed_temps)
    for start, stop in chunks:
        g = grad_out[..., start:stop, :]
        rows = rope_rows(start, stop)
        # R(phi) / den of both streams, (B, h, n, 2, 2d): its products with g are dS
        scaled = kernels.query_features(q[..., start:stop, :], signed_temps, key_mean, *rows, float(eps))
        grad_rot = q.new_empty(batch, heads, 2, stop - start, 2 * head_dim)
        for s in range(2):
            columns = slice(s * half, (s + 1) * half)
            grad_state[..., columns] += scaled[..., s, :].transpose(-1, -2) @ g[..., columns]
            torch.matmul(g[..., columns], state_t[..., columns, :], out=grad_rot[:, :, s])
        mean_parts, temp_parts = kernels.query_grads(q[..., start:stop, :], signed_temps, key_mean, *rows,
                                                      float(eps), g, out[..., start:stop, :], grad_rot,
                                                      grad_q[..., start:stop, :])
        grad_mean += mean_parts.sum(1).view_as(grad_mean)
        grad_temps += temp_parts.view(batch, heads, -1, 4, head_dim).sum(dim=(0, 2))

    # pass 2, keys: dv and dk from dS and dm
    grad_state /= num_tokens
    grad_mean = (grad_mean / num_tokens).contiguous()
    grad_state_t = grad_state.transpose(-1, -2)  # (B, h, dv, 2d)
    for start, stop in chunks:
        rows = rope_rows(start, stop)
        rotated, _, _ = kernels.key_features(k[..., start:stop, :], *rows)  # R(phi_k), (B, h, n, 2d)
        if grad_v.is_contiguous():
            torch.matmul(rotated, grad_state, out=grad_v[..., start:stop, :])
        else:  # a strided view (of a packed gradient): the product lands there by a copy
            grad_v[..., start:stop, :] = rotated @ grad_state
        grad_rot = v[..., start:stop, :] @ grad_state_t
        kernels.key_grads(k[..., start:stop, :], *rows, grad_rot, grad_mean, grad_k[..., start:stop, :])

    return _temperature_grads(grad_q, grad_k, grad_v, grad_temps, dtypes)


def _temperature_grads(grad_q, grad_k, grad_v, grad_temps, dtypes):
    """The gradients in their inputs' dtypes, the signed rows ``[ts[:d], -ts[d:], -to[:d], to[d:]]``
    of ``grad_temps`` ``(h, 4, d)`` turned into the two temperatures'."""
    grad_same = torch.cat([grad_temps[:, 0], -grad_temps[:, 1]], dim=-1)
    grad_opp = torch.cat([-grad_temps[:, 2], grad_temps[:, 3]], dim=-1)
    return tuple(g.to(dtype) for g, dtype in zip((grad_q, grad_k, grad_v, grad_same, grad_opp), dtypes))
