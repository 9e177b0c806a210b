"""Host side of the fused Triton backend of :func:`~polaformerpp.ops.pola_attention`.

Launches the kernels of :mod:`.triton_kernels` (which documents their
decomposition and numerics) and wraps them for autograd. ``tl.dot`` runs with
``input_precision='tf32x3'`` for fp32 inputs (about fp32 accuracy on tensor
cores), ``'tf32'`` for fp16/bf16 inputs (well below their own rounding) and
``'ieee'`` before Ampere.

Autograd and ``torch.compile``: forward and backward are the custom ops
``torch.ops.polaformerpp.pola_attention_triton_{fwd,bwd}`` (with fake
implementations and an autograd formula), so compiled graphs treat them as
opaque nodes instead of tracing into Triton.
"""
from typing import Optional, Tuple, Union

import torch
import triton
from torch import Tensor

from ..rope import RopeHalves
from .common import FUSED_DTYPES, Rope, as_rope_halves, rope_tensors
from .triton_kernels import (
    INTERPRET,
    INTERPRET_CHUNK_LEN,
    MAX_BLOCK_N,
    NUM_QUADS,
    NUM_STREAMS,
    block_d,
    bwd_key_value_kernel,
    bwd_query_kernel,
    bwd_state_kernel,
    fwd_out_kernel,
    fwd_state_kernel,
)

__all__ = ['pola_attention_triton', 'kernel_rope_args']

_MAX_GRID_Y = 65535    # CUDA limit of the second grid axis (batch * heads)


def _chunk_len(seq_len: int, programs_per_chunk: int, device: torch.device) -> int:
    """Tokens per program of the reduction kernels.

    On a GPU about four waves of programs in total (so a single head with a
    long sequence still fills the device), in multiples of the largest token
    tile; under the interpreter two small tiles (to exercise the reduction).
    """
    if INTERPRET or device.type != 'cuda':
        return INTERPRET_CHUNK_LEN
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    chunks = max(1, (4 * num_sms) // programs_per_chunk)
    chunk = triton.cdiv(seq_len, chunks)
    return max(MAX_BLOCK_N, triton.cdiv(chunk, MAX_BLOCK_N) * MAX_BLOCK_N)


def _strides(t: Tensor):
    return tuple(t.stride())


def _quads_to_channels(x: Tensor, head_dim: int) -> Tensor:
    """``(..., 4, BLOCK_D)`` quad layout -> ``(..., 2d)`` feature channel order."""
    half = head_dim // 2
    pe, po, ne, no = (x[..., j, :half] for j in range(NUM_QUADS))
    pos = torch.stack([pe, po], dim=-1).flatten(-2)
    neg = torch.stack([ne, no], dim=-1).flatten(-2)
    return torch.cat([pos, neg], dim=-1)


def _precision(q: Tensor) -> str:
    """``tl.dot`` input precision: three-pass TF32 (about fp32 accuracy, tensor cores) for fp32
    inputs, TF32 for fp16/bf16 inputs (below their own rounding), IEEE before Ampere."""
    if q.device.type == 'cuda' and not INTERPRET and torch.cuda.get_device_capability(q.device)[0] < 8:
        return 'ieee'
    return 'tf32x3' if q.dtype == torch.float32 else 'tf32'


def _rope_args(rope, q):
    """Kernel arguments of the RoPE tables (``q`` as an unused placeholder pointer without
    RoPE) and the ``HAS_ROPE``/``ROPE_GRID`` flags.

    ``rope``: the ``(sin_lo, cos_lo, sin_hi, cos_hi, rope_width)`` of :func:`kernel_rope_args`.
    """
    sin_lo, cos_lo, sin_hi, cos_hi, rope_width = rope
    if sin_lo is None:
        return (q, q, q, q, 0, 0, 0), dict(HAS_ROPE=False, ROPE_GRID=False)
    args = (sin_lo, cos_lo, sin_hi, cos_hi, max(rope_width, 1), sin_lo.stride(0), sin_hi.stride(0))
    return args, dict(HAS_ROPE=True, ROPE_GRID=rope_width > 0)


def _forward(q, k, v, temps, rope, eps):
    """Returns ``o`` ``(B, h, N, d)`` in q's dtype, ``state`` ``(B h, 2, 4, BD, BD)`` and
    ``mean`` ``(B h, 4, BD)`` (fp32, already divided by N).

    ``rope``: ``(sin_lo, cos_lo, sin_hi, cos_hi, rope_width)`` (see :func:`kernel_rope_args`).
    """
    batch, heads, seq_len, head_dim = q.shape
    bd = block_d(head_dim)
    bh = batch * heads
    temps = temps.contiguous()
    rope_args, rope_meta = _rope_args(rope, q)
    meta = dict(HEAD_DIM=head_dim, BLOCK_D=bd, PRECISION=_precision(q), **rope_meta)
    chunk_len = _chunk_len(seq_len, NUM_STREAMS * bh, q.device)
    num_chunks = triton.cdiv(seq_len, chunk_len)
    f32 = dict(device=q.device, dtype=torch.float32)
    state_part = torch.empty(bh, num_chunks, NUM_STREAMS, NUM_QUADS, bd, bd, **f32)
    mean_part = torch.empty(bh, num_chunks, NUM_QUADS, bd, **f32)
    fwd_state_kernel[(num_chunks * NUM_STREAMS, bh)](
        k, v, *rope_args, state_part, mean_part, seq_len, heads, chunk_len,
        *_strides(k), *_strides(v), **meta)
    state = state_part.sum(dim=1) / seq_len
    mean = mean_part.sum(dim=1) / seq_len

    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    grid = lambda cfg: (triton.cdiv(seq_len, cfg['BLOCK_N']) * NUM_STREAMS, bh)  # noqa: E731
    fwd_out_kernel[grid](q, temps, *rope_args, state, mean, out, seq_len, heads, eps,
                          *_strides(q), *_strides(out), **meta)
    return out, state, mean


def _backward(grad_out, q, k, v, temps, rope, state, mean, eps, needs_query, needs_key_value):
    """Returns ``dq``, ``dk``, ``dv`` (``None`` where not needed) and ``dtemps`` ``(2, h, 2d)`` fp32."""
    batch, heads, seq_len, head_dim = q.shape
    bd = block_d(head_dim)
    bh = batch * heads
    temps = temps.contiguous()
    rope_args, rope_meta = _rope_args(rope, q)
    meta = dict(HEAD_DIM=head_dim, BLOCK_D=bd, PRECISION=_precision(q), **rope_meta)
    f32 = dict(device=q.device, dtype=torch.float32)
    dq = dk = dv = dtemps = None

    if needs_key_value:
        chunk_len = _chunk_len(seq_len, NUM_STREAMS * bh, q.device)
        num_chunks = triton.cdiv(seq_len, chunk_len)
        dstate_part = torch.empty(bh, num_chunks, NUM_STREAMS, NUM_QUADS, bd, bd, **f32)
        dmean_part = torch.empty(bh, num_chunks, NUM_STREAMS, NUM_QUADS, bd, **f32)
        bwd_state_kernel[(num_chunks * NUM_STREAMS, bh)](
            q, grad_out, temps, *rope_args, state, mean, dstate_part, dmean_part,
            seq_len, heads, chunk_len, eps, *_strides(q), *_strides(grad_out), **meta)
        dstate = dstate_part.sum(dim=1) / seq_len              # dL/d(R(phi_k)^T v) = dS / N
        dmean = dmean_part.sum(dim=(1, 2)) / seq_len           # dL/d(sum_n phi_k) = dm / N
        dk = torch.empty(k.shape, device=k.device, dtype=k.dtype)
        dv = torch.empty(v.shape, device=v.device, dtype=v.dtype)
        grid = lambda cfg: (triton.cdiv(seq_len, cfg['BLOCK_N']), bh)  # noqa: E731
        bwd_key_value_kernel[grid](
            k, v, *rope_args, dstate, dmean, dk, dv, seq_len, heads,
            *_strides(k), *_strides(v), *_strides(dk), *_strides(dv), **meta)

    if needs_query:
        chunk_len = _chunk_len(seq_len, bh, q.device)
        num_chunks = triton.cdiv(seq_len, chunk_len)
        dtemp_part = torch.empty(bh, num_chunks, NUM_STREAMS, NUM_QUADS, bd, **f32)
        dq = torch.empty(q.shape, device=q.device, dtype=q.dtype)
        bwd_query_kernel[(num_chunks, bh)](
            q, grad_out, temps, *rope_args, state, mean, dq, dtemp_part,
            seq_len, heads, chunk_len, eps, *_strides(q), *_strides(grad_out), *_strides(dq), **meta)
        dtemp_quads = dtemp_part.sum(dim=1).view(batch, heads, NUM_STREAMS, NUM_QUADS, bd).sum(dim=0)
        dtemps = _quads_to_channels(dtemp_quads, head_dim).transpose(0, 1).contiguous()  # (2, h, 2d)
    return dq, dk, dv, dtemps


# ----------------------------------------------------------------------------
# Autograd: two custom ops (opaque to torch.compile, which then needs no graph break).
# ----------------------------------------------------------------------------

_OP_NAMESPACE = 'polaformerpp'


def _fwd_impl(q: Tensor, k: Tensor, v: Tensor, temps: Tensor, sin_lo: Optional[Tensor],
              cos_lo: Optional[Tensor], sin_hi: Optional[Tensor], cos_hi: Optional[Tensor],
              rope_width: int, eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    """``(out, state, mean)``; ``temps`` is the fp32 ``(2, h, 2d)`` stack of both temperatures."""
    return _forward(q, k, v, temps, (sin_lo, cos_lo, sin_hi, cos_hi, rope_width), eps)


def _fwd_fake(q, k, v, temps, sin_lo, cos_lo, sin_hi, cos_hi, rope_width, eps):
    bh, bd = q.shape[0] * q.shape[1], block_d(q.shape[-1])
    return (q.new_empty(q.shape),
            q.new_empty((bh, NUM_STREAMS, NUM_QUADS, bd, bd), dtype=torch.float32),
            q.new_empty((bh, NUM_QUADS, bd), dtype=torch.float32))


def _bwd_impl(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, temps: Tensor, sin_lo: Optional[Tensor],
              cos_lo: Optional[Tensor], sin_hi: Optional[Tensor], cos_hi: Optional[Tensor], rope_width: int,
              state: Tensor, mean: Tensor, eps: float, needs_query: bool,
              needs_key_value: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(dq, dk, dv, dtemps)``; gradients that are not needed come back empty."""
    dq, dk, dv, dtemps = _backward(grad_out, q, k, v, temps,
                                   (sin_lo, cos_lo, sin_hi, cos_hi, rope_width),
                                   state, mean, eps, needs_query, needs_key_value)
    empty = q.new_empty(0)
    return (empty if dq is None else dq, empty if dk is None else dk, empty if dv is None else dv,
            empty if dtemps is None else dtemps)


def _bwd_fake(grad_out, q, k, v, temps, sin_lo, cos_lo, sin_hi, cos_hi, rope_width, state, mean, eps,
              needs_query, needs_key_value):
    empty = q.new_empty(0)
    return (q.new_empty(q.shape) if needs_query else empty,
            k.new_empty(k.shape) if needs_key_value else empty,
            v.new_empty(v.shape) if needs_key_value else empty,
            temps.new_empty(temps.shape) if needs_query else empty)


def _setup_context(ctx, inputs, output):
    q, k, v, temps, sin_lo, cos_lo, sin_hi, cos_hi, rope_width, eps = inputs
    _, state, mean = output
    ctx.save_for_backward(q, k, v, temps, sin_lo, cos_lo, sin_hi, cos_hi, state, mean)
    ctx.mark_non_differentiable(state, mean)
    ctx.eps = eps
    ctx.rope_width = rope_width


def _fwd_backward(ctx, grad_out, grad_state, grad_mean):
    q, k, v, temps, sin_lo, cos_lo, sin_hi, cos_hi, state, mean = ctx.saved_tensors
    needs = ctx.needs_input_grad
    needs_query, needs_key_value = needs[0] or needs[3], needs[1] or needs[2]
    dq, dk, dv, dtemps = _bwd_op()(grad_out, q, k, v, temps, sin_lo, cos_lo, sin_hi, cos_hi, ctx.rope_width,
                                   state, mean, ctx.eps, needs_query, needs_key_value)
    return (dq if needs_query else None, dk if needs_key_value else None,
            dv if needs_key_value else None, dtemps if needs_query else None) + (None,) * 6


def _register_ops():
    """Define ``polaformerpp::pola_attention_triton_{fwd,bwd}`` once per process.

    On a module reload the registered ops stay; they call this module's functions
    through its (re-executed) globals, so they pick up the reloaded kernels.
    """
    namespace = getattr(torch.ops, _OP_NAMESPACE)
    if hasattr(namespace, 'pola_attention_triton_fwd'):
        return
    fwd = torch.library.custom_op(f'{_OP_NAMESPACE}::pola_attention_triton_fwd', _fwd_impl, mutates_args=())
    fwd.register_fake(_fwd_fake)
    bwd = torch.library.custom_op(f'{_OP_NAMESPACE}::pola_attention_triton_bwd', _bwd_impl, mutates_args=())
    bwd.register_fake(_bwd_fake)
    fwd.register_autograd(_fwd_backward, setup_context=_setup_context)


def _fwd_op():
    return getattr(torch.ops, _OP_NAMESPACE).pola_attention_triton_fwd


def _bwd_op():
    return getattr(torch.ops, _OP_NAMESPACE).pola_attention_triton_bwd


_register_ops()


def _check_triton_inputs(q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor,
                         rope: Optional[RopeHalves]) -> None:
    if q.device.type != 'cuda' and not INTERPRET:
        raise ValueError(f"backend='triton' needs CUDA tensors (got q on {q.device}); on CPU use "
                         f"backend='torch' or 'auto', or set TRITON_INTERPRET=1 before importing triton")
    for name, t in (('q', q), ('k', k), ('v', v)):
        if t.dtype not in FUSED_DTYPES:
            raise ValueError(f"backend='triton' supports float32, float16 and bfloat16; {name} has dtype "
                             f"{t.dtype} (use backend='torch')")
    if q.shape[0] * q.shape[1] > _MAX_GRID_Y:
        raise ValueError(f"backend='triton' supports batch * heads <= {_MAX_GRID_Y}, got "
                         f"{q.shape[0]} * {q.shape[1]} (use backend='torch')")
    if v.shape[-1] != q.shape[-1]:
        raise ValueError(f"backend='triton' needs the head dim of v ({v.shape[-1]}) to equal the head "
                         f"dim of q ({q.shape[-1]}) (use backend='torch')")
    tensors = [k, v, temp_same, temp_opp, *rope_tensors(rope)]
    if any(t.device != q.device for t in tensors):
        raise ValueError('q, k, v, temp_same, temp_opp and rope must all be on the same device, '
                         f'q is on {q.device}')


def kernel_rope_args(rope: Optional[RopeHalves]) -> Tuple[Optional[Tensor], ...]:
    """The RoPE arguments of the custom ops: ``(sin_lo, cos_lo, sin_hi, cos_hi, rope_width)``.

    The tables of ``rope`` detached (the kernels do not differentiate them);
    ``(None, None, None, None, 0)`` without RoPE.
    """
    if rope is None:
        return None, None, None, None, 0
    *tables, grid_width = rope
    return (*(t.detach() for t in tables), grid_width)


def pola_attention_triton(q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor,
                          rope: Union[Rope, RopeHalves] = None, eps: float = 1e-6) -> Tensor:
    """Fused Triton implementation of :func:`~polaformerpp.ops.pola_attention`.

    Args:
        q, k, v: ``(B, h, N, d)``, any strides, fp32/fp16/bf16, ``d`` even
            (``v``'s head dim must equal ``d``).
        temp_same, temp_opp: ``(h, 2d)`` temperatures (already sigmoid'ed).
        rope: ``None``, a ``RopeGrid(H, W)`` (kernels read ``(H, d)`` row and
            ``(W, d)`` column tables), ``(sin, cos)`` tables, each ``(N, 2d)``
            (not differentiated), or the :class:`~polaformerpp.ops.rope.RopeHalves` of either.
        eps: added to the denominator.

    Returns:
        Tensor: ``(B, h, N, d)`` contiguous, in ``q``'s dtype.
    """
    rope = as_rope_halves(rope, q.shape[-1], q.device)
    _check_triton_inputs(q, k, v, temp_same, temp_opp, rope)
    rope_args = kernel_rope_args(rope)
    # Stacking/casting the temperatures outside the op lets autograd route dtemps back to
    # both (in their own dtypes).
    temps = torch.stack([temp_same, temp_opp]).to(torch.float32)  # (2, h, 2d)
    out, _, _ = _fwd_op()(q, k, v, temps, *rope_args, float(eps))
    return out
