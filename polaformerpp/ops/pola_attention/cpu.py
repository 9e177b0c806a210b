"""Fused CPU forward of :func:`~polaformerpp.ops.pola_attention` (``backend='cpu'``).

The C++ kernels (``polaformerpp/ops/csrc/pola_attention/``, loaded by
:mod:`polaformerpp.ops.library`) build each token's feature
maps in registers (one exp per element and stream, RoPE as a pair rotation,
the denominator ``phi . m`` on the fly).

Inputs in the shift-free exponent range (the case of trained networks; one
compiled pass over ``q`` and ``k`` decides) take two block-fused passes:
``key_state`` builds the key rows of a block of tokens in a per-thread buffer
and multiplies them into the state while they are in cache, ``readout`` does
the same for the query rows and writes the products, divided by their
denominators, into the output (``(B, h, N, dv)``, or with ``lepe`` and
``gate`` (:func:`~polaformerpp.ops.pola_attention_gated`) ``(merged heads +
lepe) * gate`` straight into the token layout). No feature row reaches memory,
and the extra memory is a few blocks per thread whatever N is. For head dims
that are multiples of 8 the rows are 8-float vector code, compiled for
AVX-512, AVX2 and the baseline in one build and chosen at run time.

Inputs that need exponent shifts run the same two passes over token chunks
as the eager backend (:mod:`.eager`): the kernels write the feature rows and
the products are ``torch.matmul``. The tests hold both to the eager backend.

Forward only: under autograd the dispatcher wraps it in
:class:`~.cpu_backward.PolaAttentionCPU` (analytic backward).
"""
import math
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from ..library import cpu_kernels_apply, kernels
from ..rope import RopeHalves
from .common import (
    MAX_QUERY_EXPONENT,
    SHIFT_FREE_PRODUCT_EXPONENT,
    Rope,
    as_rope_halves,
    check_temperatures,
    chunk_tokens,
    exceeds_shift_free_range,
    key_exponent_shifts,
    key_normalisation,
    needs_exponent_shift,
    rope_pair_error,
    signed_rows,
    signed_temperatures,
    token_chunks,
)

__all__ = ['pola_attention_cpu', 'pola_attention_cpu_with_state', 'cpu_kernels_available', 'cpu_kernels_apply',
           'exponent_shift_needed']


def cpu_kernels_available() -> bool:
    """Whether the compiled CPU kernels were built with this installation."""
    return kernels is not None


def float_rows(t: Tensor) -> Tensor:
    """fp32 with a contiguous last dim (any other strides are read in place)."""
    t = t.to(torch.float32)
    return t if t.stride(-1) == 1 else t.contiguous()


def rope_rows_for_kernels(rope: Optional[RopeHalves]):
    """``rows(start, stop) -> (sin_lo, cos_lo, sin_hi, cos_hi, grid_width, offset)`` for a chunk."""
    if rope is None:
        return lambda start, stop: (None, None, None, None, 0, 0)
    *tables, grid_width = rope
    tables = [t.to(torch.float32) for t in tables]
    if grid_width:  # row/column tables, indexed by the chunk's token numbers
        return lambda start, stop: (*tables, grid_width, start)
    return lambda start, stop: (*(t[start:stop] for t in tables), 0, 0)


def pola_attention_cpu(q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor,
                       rope: Union[Rope, RopeHalves] = None, eps: float = 1e-6,
                       chunk_size: Optional[int] = None, lepe: Optional[Tensor] = None,
                       gate: Optional[Tensor] = None, lepe_writable: bool = False) -> Tensor:
    """Fused CPU implementation (no argument checks; see :func:`~polaformerpp.ops.pola_attention`).

    Args and returns as :func:`~polaformerpp.ops.pola_attention` (``rope`` may
    also be its :class:`~polaformerpp.ops.rope.RopeHalves`); fp32 compute for
    fp32/fp16/bf16 inputs, output in ``q``'s dtype. Not differentiable
    (:class:`~.cpu_backward.PolaAttentionCPU` is).
    With ``lepe`` and ``gate`` (both ``(B, N, h * dv)``, last dim contiguous)
    it returns ``(merged heads + lepe) * gate``, ``(B, N, h * dv)``, as
    :func:`~polaformerpp.ops.pola_attention_gated` (which describes ``lepe_writable``).
    """
    return pola_attention_cpu_with_state(q, k, v, temp_same, temp_opp, rope, eps, chunk_size, lepe, gate,
                                         lepe_writable)[0]


def exponent_shift_needed(q: Tensor, k: Tensor, temp_same: Tensor, temp_opp: Tensor) -> bool:
    """:func:`~.common.needs_exponent_shift`, for fp32 ``q, k`` with contiguous rows by one
    compiled pass over each (the torch form decides for other inputs and where an element
    is not finite)."""
    compiled = kernels is not None and all(
        t.dtype == torch.float32 and t.dim() == 4 and t.stride(-1) == 1 for t in (q, k))
    if not compiled:
        return needs_exponent_shift(q, k, temp_same, temp_opp)
    key_top, query_top = kernels.abs_max(k.detach()), kernels.abs_max(q.detach())
    if math.isnan(key_top) or math.isnan(query_top):
        return needs_exponent_shift(q, k, temp_same, temp_opp)
    return exceeds_shift_free_range(key_top, query_top, temp_same, temp_opp)


def lepe_accumulator(lepe: Tensor, lepe_writable: bool, heads: int) -> Tuple[Tensor, Tensor]:
    """The fp32 ``(B, N, h * dv)`` buffer the readout products accumulate onto (``lepe`` itself where
    writable, a copy otherwise), and its ``(B, h, N, dv)`` view, the products' output in the token layout."""
    writable = lepe_writable and lepe.dtype == torch.float32 and lepe.is_contiguous()
    out = lepe if writable else lepe.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    return out, out.unflatten(-1, (heads, -1)).transpose(1, 2)


def _fused_forward(q, k, v, temp_same, temp_opp, rope_rows, eps, lepe, gate, lepe_writable, out_dtype):
    """Both passes of the shift-free forward through the block-fused kernels (fp32 rows in).

    ``key_state`` builds the key features block by block in cache and multiplies them
    into the state there; ``readout`` does the same for the query features and writes
    the products, divided by their denominators (plus LePE, times the gate), into the output.
    """
    batch, heads, num_tokens, _ = q.shape
    tables = rope_rows(0, num_tokens)[:5]  # sin/cos lo/hi and the grid width; token 0 onwards
    state, key_mean, paired = kernels.key_state(k, v, *tables)
    if not paired:
        raise rope_pair_error('rope (sin, cos)')
    signed_temps = signed_temperatures(temp_same.to(torch.float32), temp_opp.to(torch.float32)).contiguous()
    if lepe is None:
        out = torch.empty(batch, heads, num_tokens, v.shape[-1], dtype=torch.float32)
        kernels.readout(q, signed_temps, key_mean, state, *tables, float(eps), out, False)
        return out.to(out_dtype), state, key_mean, False
    out, out_heads = lepe_accumulator(lepe, lepe_writable, heads)
    kernels.readout(q, signed_temps, key_mean, state, *tables, float(eps), out_heads, True, float_rows(gate))
    return out.to(out_dtype), state, key_mean, False


def pola_attention_cpu_with_state(q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor,
                                  rope: Union[Rope, RopeHalves] = None, eps: float = 1e-6,
                                  chunk_size: Optional[int] = None, lepe: Optional[Tensor] = None,
                                  gate: Optional[Tensor] = None, lepe_writable: bool = False,
                                  shifted: Optional[bool] = None) -> Tuple[Tensor, Tensor, Tensor, bool]:
    """:func:`pola_attention_cpu` that also returns what its backward reads (:mod:`.cpu_backward`).

    ``shifted``: the result of :func:`~.common.needs_exponent_shift` for these
    inputs where the caller has it (computed here otherwise). ``chunk_size``:
    tokens per step of the chunked passes that shifted inputs take (the fused
    passes work in fixed blocks).

    Returns:
        tuple: the output; the state ``S`` ``(B, h, 2d, dv)`` and key mean ``m``
        ``(B, h, 2d)`` (fp32, both divided by the keys' scale where shifted);
        and whether the exponent shifts were used.
    """
    if kernels is None:
        raise RuntimeError('the fused CPU kernels are not built: run `python setup.py build_ext --inplace` '
                           '(tools/setup_env.sh does) with a C++ compiler, or use backend="torch"')
    out_dtype = q.dtype
    q, k, v = float_rows(q), float_rows(k), float_rows(v)
    check_temperatures(temp_same, temp_opp)
    rope = as_rope_halves(rope, q.shape[-1])
    rope_rows = rope_rows_for_kernels(rope)
    # exponent shifts (see .common) only where some exponent may leave the shift-free range
    if shifted is None:
        shifted = exponent_shift_needed(q, k, temp_same, temp_opp)
    if not shifted:
        return _fused_forward(q, k, v, temp_same, temp_opp, rope_rows, eps, lepe, gate, lepe_writable, out_dtype)
    batch, heads, num_tokens, head_dim = q.shape
    half = v.shape[-1] // 2
    chunk_size = chunk_size or chunk_tokens(q)
    chunks = token_chunks(num_tokens, chunk_size)
    pairs = rope is not None
    key_shifts = key_exponent_shifts(k, pairs).contiguous() if shifted else None

    # pass 1: keys -> state S (B, h, 2d, dv) and mean feature m (B, h, 2d)
    state = key_sum = None
    for start, stop in chunks:
        features, feature_sum, paired = kernels.key_features(k[..., start:stop, :], *rope_rows(start, stop),
                                                              key_shifts)
        if not paired:
            raise rope_pair_error('rope (sin, cos)')
        chunk_state = features.transpose(-1, -2) @ v[..., start:stop, :]
        state = chunk_state if state is None else state.add_(chunk_state)
        key_sum = feature_sum if key_sum is None else key_sum.add_(feature_sum)
    state.div_(num_tokens)
    key_mean = key_sum.div_(num_tokens).contiguous()
    log_rows = log_mean_rows = None
    if key_shifts is not None:  # the queries take the keys' scale: m'' <= 1
        key_divisor, log_scale = key_normalisation(key_shifts, key_mean, pairs)
        state.div_(key_divisor[..., None])
        key_mean.div_(key_divisor)
        log_rows, log_mean_rows = signed_rows(log_scale).contiguous(), signed_rows(key_mean.log()).contiguous()
    state_same, state_opp = state[..., :half], state[..., half:]

    # pass 2: queries -> both streams, written into the output
    signed_temps = signed_temperatures(temp_same.to(torch.float32), temp_opp.to(torch.float32)).contiguous()
    gated = lepe is not None
    if gated:
        gate = float_rows(gate)
        out, out_heads = lepe_accumulator(lepe, lepe_writable, heads)
    else:
        out = torch.empty(batch, heads, num_tokens, 2 * half, dtype=torch.float32)
    for start, stop in chunks:
        # rows already divided by their denominators: the products are the outputs
        features = kernels.query_features(q[..., start:stop, :], signed_temps, key_mean,
                                           *rope_rows(start, stop), float(eps), log_rows, log_mean_rows,
                                           SHIFT_FREE_PRODUCT_EXPONENT, MAX_QUERY_EXPONENT)
        if not gated:
            target = out[..., start:stop, :]
            torch.matmul(features[..., 0, :], state_same, out=target[..., :half])
            torch.matmul(features[..., 1, :], state_opp, out=target[..., half:])
            continue
        for b in range(batch):  # one batched product over the heads per sample and stream
            target = out_heads[b, :, start:stop]
            target[..., :half].baddbmm_(features[b, :, :, 0], state_same[b])
            target[..., half:].baddbmm_(features[b, :, :, 1], state_opp[b])
        out[:, start:stop].mul_(gate[:, start:stop])  # the chunk's rows are still in cache
    return out.to(out_dtype), state, key_mean, shifted

