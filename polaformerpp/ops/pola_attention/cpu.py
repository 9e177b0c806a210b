"""Fused CPU forward of :func:`~polaformerpp.ops.pola_attention` (``backend='cpu'``, inference).

The C++ kernels in ``csrc/pola_features_cpu.cpp`` build each token's feature
maps in registers (one exp per element and stream, RoPE as a pair rotation,
the denominator ``phi . m`` on the fly) and write only the rows the two matrix
products read; the products are ``torch.matmul`` (MKL/oneDNN). Same two passes
over token chunks as the eager backend (:mod:`.eager`), which the tests hold
this path to.

With ``lepe`` and ``gate`` (:func:`~polaformerpp.ops.pola_attention_gated`)
the readout products accumulate onto the LePE term (``addmm`` with ``beta = 1``)
and write the token layout ``(B, N, h * dv)`` directly, and the gate product
follows chunk by chunk while the rows are still in cache: the attention output
never exists in the head layout.

Forward only: under autograd the dispatcher wraps it in
:class:`~.cpu_backward.PolaAttentionCPU` (analytic backward).
"""
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from ..rope import RopeHalves
from .common import (
    MAX_QUERY_EXPONENT,
    SHIFT_FREE_PRODUCT_EXPONENT,
    Rope,
    as_rope_halves,
    check_temperatures,
    chunk_tokens,
    key_exponent_shifts,
    key_normalisation,
    needs_exponent_shift,
    rope_pair_error,
    signed_rows,
    signed_temperatures,
    token_chunks,
)

try:  # the private compiled extension, loaded only here
    from . import _pola_features_cpu as kernels
except ImportError:  # built by tools/setup_env.sh (setup.py build_ext --inplace); needs a C++ compiler
    kernels = None

__all__ = ['pola_attention_cpu', 'pola_attention_cpu_with_state', 'cpu_kernels_available']


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


def pola_attention_cpu_with_state(q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor,
                                  rope: Union[Rope, RopeHalves] = None, eps: float = 1e-6,
                                  chunk_size: Optional[int] = None, lepe: Optional[Tensor] = None,
                                  gate: Optional[Tensor] = None, lepe_writable: bool = False,
                                  shifted: Optional[bool] = None) -> Tuple[Tensor, Tensor, Tensor, bool]:
    """:func:`pola_attention_cpu` that also returns what its backward reads (:mod:`.cpu_backward`).

    ``shifted``: the result of :func:`~.common.needs_exponent_shift` for these
    inputs where the caller has it (computed here otherwise).

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
    batch, heads, num_tokens, head_dim = q.shape
    half = v.shape[-1] // 2
    chunk_size = chunk_size or chunk_tokens(q)
    check_temperatures(temp_same, temp_opp)
    rope = as_rope_halves(rope, head_dim)
    rope_rows = rope_rows_for_kernels(rope)
    chunks = token_chunks(num_tokens, chunk_size)
    # exponent shifts (see .common) only where some exponent may leave the shift-free range
    pairs = rope is not None
    if shifted is None:
        shifted = needs_exponent_shift(q, k, temp_same, temp_opp)
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
        # the products accumulate onto the LePE term in place, written in the token layout;
        # (B, h, N, dv) views of it are their outputs
        writable = lepe_writable and lepe.dtype == torch.float32 and lepe.is_contiguous()
        out = lepe if writable else lepe.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
        out_heads = out.unflatten(-1, (heads, -1)).transpose(1, 2)
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

