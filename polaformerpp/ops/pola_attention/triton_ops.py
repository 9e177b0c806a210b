"""Host side of the fused Triton backend of :func:`~polaformerpp.ops.pola_attention`.

Launches the kernels of :mod:`.triton_kernels` (which documents their
decomposition and numerics) and wraps them for autograd. ``tl.dot`` runs with
``input_precision='tf32x3'`` for fp32 inputs (about fp32 accuracy on tensor
cores), ``'tf32'`` for fp16/bf16 inputs (well below their own rounding) and
``'ieee'`` before Ampere.

Exponent shifts: inputs outside the shift-free range
(:func:`~.common.needs_exponent_shift`, one host sync per call; always under
tracing) run the ``SHIFTED`` kernels, with the key shifts, divisors and log
scales of :mod:`.common` computed here with torch between the two phases.

Autograd and ``torch.compile``: forward and backward are the custom ops
``torch.ops.polaformerpp.pola_attention_triton_{fwd,bwd}`` (with fake
implementations and an autograd formula), so compiled graphs treat them as
opaque nodes instead of tracing into Triton.

Failures: a kernel that fails to build or launch raises
:class:`TritonKernelError` (naming the kernel and the error, which it chains).
With ``fallback_to_torch`` (what ``backend='auto'`` passes) a backward that
fails that way computes the gradients with the eager backend instead, after
:func:`note_kernel_failure` warned once.
"""
import warnings
from typing import Dict, Optional, Tuple, Union

import torch
import triton
from torch import Tensor

from ..rope import RopeHalves
from .common import (
    FUSED_DTYPES,
    MAX_TRITON_BATCH_HEADS,
    Rope,
    as_rope_halves,
    key_exponent_shifts,
    key_normalisation,
    needs_exponent_shift,
    rope_tensors,
)
from .eager import pola_attention_torch
from .triton_kernels import (
    INTERPRET,
    INTERPRET_CHUNK_LEN,
    MAX_BLOCK_N,
    NUM_QUADS,
    NUM_STREAMS,
    SCALE_SLOTS,
    block_d,
    bwd_key_value_kernel,
    bwd_query_kernel,
    bwd_state_kernel,
    fwd_out_kernel,
    fwd_state_kernel,
)

__all__ = ['pola_attention_triton', 'kernel_rope_args', 'TritonKernelError', 'failure_key', 'note_kernel_failure',
           'failed_before']



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


# ----------------------------------------------------------------------------
# Kernel failures (what backend='auto' falls back on).
# ----------------------------------------------------------------------------


class TritonKernelError(RuntimeError):
    """A Triton kernel of the op failed to build or launch (the error is chained as ``__cause__``)."""


#: failure_key -> the error, for every input kind whose kernels failed in this process
_FAILURES: Dict[Tuple[str, torch.dtype, int], TritonKernelError] = {}


def failure_key(q: Tensor) -> Tuple[str, torch.dtype, int]:
    """What a build failure depends on: device, input dtype and head dim."""
    return str(q.device), q.dtype, q.shape[-1]


def note_kernel_failure(q: Tensor, error: TritonKernelError) -> None:
    """Remember that the kernels failed for inputs like ``q`` and warn (once per kind of input)."""
    key = failure_key(q)
    if key in _FAILURES:
        return
    _FAILURES[key] = error
    device, dtype, head_dim = key
    warnings.warn(f"pola_attention(backend='auto'): the Triton kernels failed on {device} for "
                  f"{str(dtype).replace('torch.', '')} inputs of head dim {head_dim}, using backend='torch' "
                  f"for these inputs from now on. {error}", RuntimeWarning, stacklevel=4)


def failed_before(q: Tensor) -> bool:
    """Whether the kernels failed for inputs like ``q`` earlier in this process."""
    return failure_key(q) in _FAILURES


def _launch(kernel, grid, *args, **meta) -> None:
    """``kernel[grid](*args, **meta)``; build and launch errors come back as :class:`TritonKernelError`
    (out of memory stays what it is: the eager backend would need the memory too)."""
    try:
        kernel[grid](*args, **meta)
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as exc:  # compile errors, out of resources, ptxas, driver launch errors, ...
        name = getattr(getattr(kernel, 'base_fn', None), '__name__', type(kernel).__name__)
        raise TritonKernelError(f'Triton kernel {name} failed to build or launch: '
                                f'{type(exc).__name__}: {exc}') from exc


# ----------------------------------------------------------------------------
# Layouts and the exponent shifts.
# ----------------------------------------------------------------------------


def _quads_to_channels(x: Tensor, head_dim: int) -> Tensor:
    """``(..., 4, BLOCK_D)`` quad layout -> ``(..., 2d)`` feature channel order."""
    half = head_dim // 2
    pe, po, ne, no = (x[..., j, :half] for j in range(NUM_QUADS))
    pos = torch.stack([pe, po], dim=-1).flatten(-2)
    neg = torch.stack([ne, no], dim=-1).flatten(-2)
    return torch.cat([pos, neg], dim=-1)


def _channels_to_quads(x: Tensor, head_dim: int, fill: float) -> Tensor:
    """``(..., 2d)`` feature channels -> ``(..., 4, BLOCK_D)`` quads, padded with ``fill``
    (inverse of :func:`_quads_to_channels`)."""
    pos, neg = x[..., :head_dim], x[..., head_dim:]
    quads = torch.stack([pos[..., 0::2], pos[..., 1::2], neg[..., 0::2], neg[..., 1::2]], dim=-2)
    pad = block_d(head_dim) - head_dim // 2
    return torch.nn.functional.pad(quads, (0, pad), value=fill) if pad else quads


def _key_scales(k: Tensor, pairs: bool) -> Tensor:
    """The scale tensor of the shifted kernels ``(B h, 4, 4, BLOCK_D)`` fp32
    (:data:`~.triton_kernels.SCALE_SLOTS`) with the key shifts ``b`` of
    :func:`~.common.key_exponent_shifts` filled in (what phase 1 reads); the
    other slots are filled by :func:`_normalise_keys`; ``pairs``: RoPE pairs share them."""
    shifts = key_exponent_shifts(k, pairs).float().flatten(0, 1)  # (B h, 2d)
    scales = shifts.new_zeros(shifts.shape[0], len(SCALE_SLOTS), NUM_QUADS, block_d(k.shape[-1]))
    scales[:, SCALE_SLOTS['key_shift']] = _channels_to_quads(shifts, k.shape[-1], 0.0)
    return scales


def _normalise_keys(scales: Tensor, state: Tensor, mean: Tensor, head_dim: int,
                    pairs: bool) -> Tuple[Tensor, Tensor]:
    """Divide the shifted state and mean by the key divisors of :func:`~.common.key_normalisation`
    and fill the other slots of ``scales``: ``r``, ``L = b + log r`` and ``log m''`` (``L`` and
    ``log m''`` are ``-inf`` on padded channels).

    Args:
        scales: ``(B h, 4, 4, BD)`` from :func:`_key_scales` (written in place).
        state: ``(B h, 2, 4, BD, BD)``. mean: ``(B h, 4, BD)``.

    Returns:
        tuple: the state and the mean divided by ``r``.
    """
    divisor, log_scale = key_normalisation(_quads_to_channels(scales[:, SCALE_SLOTS['key_shift']], head_dim),
                                           _quads_to_channels(mean, head_dim), pairs)
    divisor = _channels_to_quads(divisor, head_dim, 1.0)
    state = state / divisor[:, None, :, :, None]
    mean = mean / divisor
    scales[:, SCALE_SLOTS['key_divisor']] = divisor
    scales[:, SCALE_SLOTS['log_scale']] = _channels_to_quads(log_scale, head_dim, float('-inf'))
    scales[:, SCALE_SLOTS['log_mean']] = mean.log()
    return state, mean


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


def _forward(q, k, v, temps, rope, eps, shifted):
    """Returns ``o`` ``(B, h, N, d)`` in q's dtype, ``state`` ``(B h, 2, 4, BD, BD)``,
    ``mean`` ``(B h, 4, BD)`` (fp32, already divided by N; with ``shifted`` by the key
    divisors too) and ``scales`` (``shifted``: ``(B h, 4, 4, BD)``, see :func:`_normalise_keys`;
    else empty).

    ``rope``: ``(sin_lo, cos_lo, sin_hi, cos_hi, rope_width)`` (see :func:`kernel_rope_args`).
    """
    batch, heads, seq_len, head_dim = q.shape
    bd = block_d(head_dim)
    bh = batch * heads
    temps = temps.contiguous()
    rope_args, rope_meta = _rope_args(rope, q)
    meta = dict(HEAD_DIM=head_dim, BLOCK_D=bd, PRECISION=_precision(q), SHIFTED=shifted, **rope_meta)
    chunk_len = _chunk_len(seq_len, NUM_STREAMS * bh, q.device)
    num_chunks = triton.cdiv(seq_len, chunk_len)
    f32 = dict(device=q.device, dtype=torch.float32)
    state_part = torch.empty(bh, num_chunks, NUM_STREAMS, NUM_QUADS, bd, bd, **f32)
    mean_part = torch.empty(bh, num_chunks, NUM_QUADS, bd, **f32)
    pairs = bool(rope_meta.get('HAS_ROPE'))  # rotated features need one shift per channel pair
    scales = _key_scales(k, pairs) if shifted else mean_part.new_empty(0)
    _launch(fwd_state_kernel, (num_chunks * NUM_STREAMS, bh),
            k, v, *rope_args, scales if shifted else mean_part, state_part, mean_part, seq_len, heads, chunk_len,
            *_strides(k), *_strides(v), **meta)  # (unshifted the kernels do not read the scales)
    state = state_part.sum(dim=1) / seq_len
    mean = mean_part.sum(dim=1) / seq_len
    if shifted:
        state, mean = _normalise_keys(scales, state, mean, head_dim, pairs)

    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    grid = lambda cfg: (triton.cdiv(seq_len, cfg['BLOCK_N']) * NUM_STREAMS, bh)  # noqa: E731
    _launch(fwd_out_kernel, grid, q, temps, *rope_args, state, mean, scales if shifted else mean, out,
            seq_len, heads, eps, *_strides(q), *_strides(out), **meta)
    return out, state, mean, scales


def _backward(grad_out, q, k, v, temps, rope, state, mean, scales, eps, shifted, needs_query, needs_key_value):
    """Returns ``dq``, ``dk``, ``dv`` (``None`` where not needed) and ``dtemps`` ``(2, h, 2d)`` fp32.

    ``b``, ``r``, ``L`` and ``c`` are constants: the gradients are those of the
    shifted computation with them held fixed, i.e. of the unshifted method.
    """
    batch, heads, seq_len, head_dim = q.shape
    bd = block_d(head_dim)
    bh = batch * heads
    temps = temps.contiguous()
    if grad_out.stride(-1) != 1:  # rows of channels read whole (and one build for such layouts)
        grad_out = grad_out.contiguous()
    rope_args, rope_meta = _rope_args(rope, q)
    meta = dict(HEAD_DIM=head_dim, BLOCK_D=bd, PRECISION=_precision(q), SHIFTED=shifted, **rope_meta)
    scale_arg = scales if shifted else mean  # (the kernels do not read it unshifted)
    f32 = dict(device=q.device, dtype=torch.float32)
    dq = dk = dv = dtemps = None

    if needs_key_value:
        chunk_len = _chunk_len(seq_len, NUM_STREAMS * bh, q.device)
        num_chunks = triton.cdiv(seq_len, chunk_len)
        dstate_part = torch.empty(bh, num_chunks, NUM_STREAMS, NUM_QUADS, bd, bd, **f32)
        dmean_part = torch.empty(bh, num_chunks, NUM_STREAMS, NUM_QUADS, bd, **f32)
        _launch(bwd_state_kernel, (num_chunks * NUM_STREAMS, bh),
                q, grad_out, temps, *rope_args, state, mean, scale_arg, dstate_part, dmean_part,
                seq_len, heads, chunk_len, eps, *_strides(q), *_strides(grad_out), **meta)
        dstate = dstate_part.sum(dim=1) / seq_len              # dL/d(R(phi_k)^T v) = dS / N
        dmean = dmean_part.sum(dim=(1, 2)) / seq_len           # dL/d(sum_n phi_k) = dm / N
        if shifted:  # through S'' = S' / r and m'' = m' / r (r constant)
            divisor = scales[:, SCALE_SLOTS['key_divisor']]   # (B h, 4, BD)
            dstate = dstate / divisor[:, None, :, :, None]
            dmean = dmean / divisor
        dk = torch.empty(k.shape, device=k.device, dtype=k.dtype)
        dv = torch.empty(v.shape, device=v.device, dtype=v.dtype)
        grid = lambda cfg: (triton.cdiv(seq_len, cfg['BLOCK_N']), bh)  # noqa: E731
        _launch(bwd_key_value_kernel, grid,
                k, v, *rope_args, scale_arg, dstate, dmean, dk, dv, seq_len, heads,
                *_strides(k), *_strides(v), *_strides(dk), *_strides(dv), **meta)

    if needs_query:
        chunk_len = _chunk_len(seq_len, bh, q.device)
        num_chunks = triton.cdiv(seq_len, chunk_len)
        dtemp_part = torch.empty(bh, num_chunks, NUM_STREAMS, NUM_QUADS, bd, **f32)
        dq = torch.empty(q.shape, device=q.device, dtype=q.dtype)
        _launch(bwd_query_kernel, (num_chunks, bh),
                q, grad_out, temps, *rope_args, state, mean, scale_arg, dq, dtemp_part,
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
              rope_width: int, eps: float, shifted: bool,
              fallback_to_torch: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(out, state, mean, scales)``; ``temps`` is the fp32 ``(2, h, 2d)`` stack of both temperatures.

    ``fallback_to_torch`` only matters to the backward (:func:`_fwd_backward`).
    """
    return _forward(q, k, v, temps, (sin_lo, cos_lo, sin_hi, cos_hi, rope_width), eps, shifted)


def _fwd_fake(q, k, v, temps, sin_lo, cos_lo, sin_hi, cos_hi, rope_width, eps, shifted, fallback_to_torch):
    bh, bd = q.shape[0] * q.shape[1], block_d(q.shape[-1])
    f32 = dict(dtype=torch.float32)
    return (q.new_empty(q.shape),
            q.new_empty((bh, NUM_STREAMS, NUM_QUADS, bd, bd), **f32),
            q.new_empty((bh, NUM_QUADS, bd), **f32),
            q.new_empty((bh, len(SCALE_SLOTS), NUM_QUADS, bd) if shifted else (0,), **f32))


def _bwd_impl(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, temps: Tensor, sin_lo: Optional[Tensor],
              cos_lo: Optional[Tensor], sin_hi: Optional[Tensor], cos_hi: Optional[Tensor], rope_width: int,
              state: Tensor, mean: Tensor, scales: Tensor, eps: float, shifted: bool, needs_query: bool,
              needs_key_value: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(dq, dk, dv, dtemps)``; gradients that are not needed come back empty."""
    dq, dk, dv, dtemps = _backward(grad_out, q, k, v, temps,
                                   (sin_lo, cos_lo, sin_hi, cos_hi, rope_width),
                                   state, mean, scales, eps, shifted, needs_query, needs_key_value)
    empty = q.new_empty(0)
    return (empty if dq is None else dq, empty if dk is None else dk, empty if dv is None else dv,
            empty if dtemps is None else dtemps)


def _bwd_fake(grad_out, q, k, v, temps, sin_lo, cos_lo, sin_hi, cos_hi, rope_width, state, mean, scales, eps,
              shifted, needs_query, needs_key_value):
    empty = q.new_empty(0)
    return (q.new_empty(q.shape) if needs_query else empty,
            k.new_empty(k.shape) if needs_key_value else empty,
            v.new_empty(v.shape) if needs_key_value else empty,
            temps.new_empty(temps.shape) if needs_query else empty)


def _setup_context(ctx, inputs, output):
    q, k, v, temps, sin_lo, cos_lo, sin_hi, cos_hi, rope_width, eps, shifted, fallback_to_torch = inputs
    _, state, mean, scales = output
    ctx.save_for_backward(q, k, v, temps, sin_lo, cos_lo, sin_hi, cos_hi, state, mean, scales)
    ctx.mark_non_differentiable(state, mean, scales)
    ctx.eps = eps
    ctx.rope_width = rope_width
    ctx.shifted = shifted
    ctx.fallback_to_torch = fallback_to_torch


def _eager_gradients(grad_out, q, k, v, temps, tables, rope_width, eps, needs_query, needs_key_value):
    """``(dq, dk, dv, dtemps)`` of the eager backend (``None`` where not needed): the fallback of a
    backward whose kernels failed."""
    rope = None if tables[0] is None else RopeHalves(*tables, rope_width)
    needs = (needs_query, needs_key_value, needs_key_value, needs_query)
    with torch.enable_grad():
        inputs = [t.detach().requires_grad_(need) for t, need in zip((q, k, v, temps), needs)]
        out = pola_attention_torch(inputs[0], inputs[1], inputs[2], inputs[3][0], inputs[3][1], rope, eps)
        grads = iter(torch.autograd.grad(out, [t for t in inputs if t.requires_grad], grad_out))
    return tuple(next(grads) if need else None for need in needs)


def _fwd_backward(ctx, grad_out, grad_state, grad_mean, grad_scales):
    q, k, v, temps, sin_lo, cos_lo, sin_hi, cos_hi, state, mean, scales = ctx.saved_tensors
    needs = ctx.needs_input_grad
    needs_query, needs_key_value = needs[0] or needs[3], needs[1] or needs[2]
    try:
        dq, dk, dv, dtemps = _bwd_op()(grad_out, q, k, v, temps, sin_lo, cos_lo, sin_hi, cos_hi, ctx.rope_width,
                                       state, mean, scales, ctx.eps, ctx.shifted, needs_query, needs_key_value)
    except TritonKernelError as error:
        if not ctx.fallback_to_torch:
            raise
        note_kernel_failure(q, error)
        dq, dk, dv, dtemps = _eager_gradients(grad_out, q, k, v, temps, (sin_lo, cos_lo, sin_hi, cos_hi),
                                              ctx.rope_width, ctx.eps, needs_query, needs_key_value)
    return (dq if needs_query else None, dk if needs_key_value else None,
            dv if needs_key_value else None, dtemps if needs_query else None) + (None,) * 8


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
    if q.shape[0] * q.shape[1] > MAX_TRITON_BATCH_HEADS:
        raise ValueError(f"backend='triton' supports batch * heads <= {MAX_TRITON_BATCH_HEADS}, got "
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
                          rope: Union[Rope, RopeHalves] = None, eps: float = 1e-6, *,
                          shifted: Optional[bool] = None, fallback_to_torch: bool = False) -> Tensor:
    """Fused Triton implementation of :func:`~polaformerpp.ops.pola_attention`.

    Args:
        q, k, v: ``(B, h, N, d)``, any strides, fp32/fp16/bf16, ``d`` even
            (``v``'s head dim must equal ``d``).
        temp_same, temp_opp: ``(h, 2d)`` temperatures (already sigmoid'ed).
        rope: ``None``, a ``RopeGrid(H, W)`` (kernels read ``(H, d)`` row and
            ``(W, d)`` column tables), ``(sin, cos)`` tables, each ``(N, 2d)``
            (not differentiated), or the :class:`~polaformerpp.ops.rope.RopeHalves` of either.
        eps: added to the denominator.
        shifted: run the exponent-shifted kernels; by default where
            :func:`~.common.needs_exponent_shift` asks for them (``True`` forces
            them, ``False`` is only safe in the shift-free range).
        fallback_to_torch: a backward whose kernels fail to build or launch
            computes the gradients with the eager backend (and warns once)
            instead of raising :class:`TritonKernelError`.

    Returns:
        Tensor: ``(B, h, N, d)`` contiguous, in ``q``'s dtype.

    Raises:
        TritonKernelError: a kernel failed to build or launch (the error chained).
    """
    rope = as_rope_halves(rope, q.shape[-1], q.device)
    _check_triton_inputs(q, k, v, temp_same, temp_opp, rope)
    rope_args = kernel_rope_args(rope)
    if shifted is None:
        shifted = needs_exponent_shift(q, k, temp_same, temp_opp)
    # Stacking/casting the temperatures outside the op lets autograd route dtemps back to
    # both (in their own dtypes).
    temps = torch.stack([temp_same, temp_opp]).to(torch.float32)  # (2, h, 2d)
    out, _, _, _ = _fwd_op()(q, k, v, temps, *rope_args, float(eps), bool(shifted), bool(fallback_to_torch))
    return out
