"""The public entry point: argument checks, backend choice, one RoPE conversion.

``backend='auto'`` picks the Triton kernels for CUDA tensors. Where they fail
to build or launch on the device (an old GPU, a missing toolchain, a Triton
bug), it falls back to the eager torch backend with one warning naming the
error, and keeps using it for inputs of that kind (device, dtype, head dim) in
this process; a backward whose kernels fail does the same. ``backend='triton'``
raises the :class:`~.triton_ops.TritonKernelError` instead.
"""
from typing import Tuple

import torch
from torch import Tensor

from .common import (
    FUSED_DTYPES,
    MAX_TRITON_BATCH_HEADS,
    Rope,
    as_rope_halves,
    check_rope,
    is_tracing,
    rope_tensors,
)
from .cpu import cpu_kernels_available, exponent_shift_needed, pola_attention_cpu
from .cpu_backward import pola_attention_cpu_trainable
from .custom_ops import pola_attention_cpu_traceable
from .eager import pola_attention_torch

__all__ = ['pola_attention', 'pola_attention_gated', 'gated_output', 'available_backends', 'BACKENDS']

#: values of ``pola_attention(..., backend=)``
BACKENDS = ('auto', 'torch', 'cpu', 'triton')


def _triton_usable() -> bool:
    """Whether the Triton backend imports (Triton installed; kernels defined lazily, on first use)."""
    try:
        from . import triton_ops  # noqa: F401
    except ImportError:
        return False
    return True


def available_backends() -> Tuple[str, ...]:
    """Backends usable in this process (``'cpu'`` needs the compiled kernels,
    ``'triton'`` a CUDA device and Triton)."""
    backends = ['torch']
    if cpu_kernels_available():
        backends.append('cpu')
    if _triton_usable():
        backends.append('triton')
    return tuple(backends)


def _triton_failed_before(q: Tensor) -> bool:
    """Whether the Triton kernels failed earlier in this process for inputs like ``q``."""
    from .triton_ops import failed_before
    return failed_before(q)


def _on_triton_device(q: Tensor) -> bool:
    """Whether ``'auto'`` considers the Triton kernels for ``q``: CUDA tensors with ``B * h`` within the grid."""
    return q.is_cuda and q.shape[0] * q.shape[1] <= MAX_TRITON_BATCH_HEADS


def _pick_backend(q: Tensor, k: Tensor, v: Tensor) -> str:
    fused_dtypes = all(t.dtype in FUSED_DTYPES for t in (q, k, v))
    if (_on_triton_device(q) and fused_dtypes and v.shape[-1] == q.shape[-1] and _triton_usable()
            and not _triton_failed_before(q)):
        return 'triton'
    # torch.compile and torch.export see the compiled kernels as custom ops (.custom_ops);
    # torch.jit.trace (flop counters) sees the eager backend
    if q.device.type == 'cpu' and fused_dtypes and not torch.jit.is_tracing() and cpu_kernels_available():
        return 'cpu'
    return 'torch'


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
    check_rope(rope, num_tokens, head_dim)
    if not isinstance(eps, (int, float)) or eps < 0:
        raise ValueError(f'eps must be a non-negative number, got {eps!r}')
    if backend not in BACKENDS:
        raise ValueError(f'backend must be one of {BACKENDS}, got {backend!r}')


def pola_attention(q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor,
                   rope: Rope = None, eps: float = 1e-6,
                   backend: str = 'auto') -> Tensor:
    """Polarity-aware linear attention, both streams at once.

    Args:
        q, k: ``(B, h, N, d)``, ``d`` even.
        v: ``(B, h, N, dv)``, ``dv`` even (``dv == d`` in every model here).
        temp_same, temp_opp: ``(h, 2d)`` channel-wise temperatures, already
            passed through a sigmoid (non-negative).
        rope: applied to the numerator only. ``None``; ``RopeGrid(H, W)``
            (``H * W == N``): the 2-D RoPE of :func:`pola_rope_tables`, which
            the backends build from per-row and per-column tables (the
            cheapest form); or ``(sin, cos)`` tables, each ``(N, 2d)``, a
            rotation of channel pairs (channels ``2i`` and ``2i+1`` share one
            angle).
        eps: added to the denominator.
        backend: ``'torch'`` (eager, differentiable), ``'cpu'`` (fused CPU
            kernels; under autograd with an analytic backward, or the torch
            backend's autograd for inputs that need exponent shifts),
            ``'triton'`` (CUDA tensors) or ``'auto'`` (the fastest one usable
            for these tensors: triton on CUDA, cpu for fp32/fp16/bf16 CPU
            tensors (as custom ops under torch.compile / torch.export), torch
            otherwise and under torch.jit.trace; never
            fails: where the Triton kernels fail to build or launch it warns
            once and runs the torch backend).

    Returns:
        Tensor: ``(B, h, N, dv)`` in ``q``'s dtype: ``[same-polarity stream
        over v[..., :dv/2] | opposite-polarity stream over v[..., dv/2:]]``.
        Feature maps and accumulation are fp32 for fp16/bf16 inputs.

    Raises:
        TypeError, ValueError: naming the argument and what was expected
            (shapes, dtypes, even head dims, ``backend``; with the torch
            backend also negative temperatures and RoPE tables whose pairs
            differ).
        TritonKernelError: with ``backend='triton'``, a kernel that failed to
            build or launch (a ``RuntimeError``; the error chained).
    """
    _check_inputs(q, k, v, temp_same, temp_opp, rope, eps, backend)
    records_grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (q, k, v, temp_same, temp_opp, *rope_tensors(rope)))
    auto = backend == 'auto'
    if auto:
        backend = _pick_backend(q, k, v)
    if backend == 'cpu':
        if q.device.type != 'cpu' or q.dtype not in FUSED_DTYPES or not cpu_kernels_available():
            raise ValueError("backend='cpu' needs CPU tensors in fp32/fp16/bf16 and the compiled "
                             "kernels (tools/setup_env.sh builds them); use backend='torch' or 'auto'")
        if torch.compiler.is_compiling():  # one custom op with its fake kernel and autograd
            implementation = pola_attention_cpu_traceable
        else:
            implementation = _cpu_trainable if records_grad else pola_attention_cpu
    elif backend == 'triton':
        if not _triton_usable():
            raise ValueError("backend='triton' is not available in this build: "
                             "use backend='torch' or 'auto'")
        from .triton_ops import pola_attention_triton as implementation
    else:
        implementation = pola_attention_torch
    # the one conversion of the RoPE argument: every backend reads RopeHalves
    rope = as_rope_halves(rope, q.shape[-1], q.device)
    if auto and backend == 'triton':
        return _triton_or_torch(q, k, v, temp_same, temp_opp, rope, eps)
    return implementation(q, k, v, temp_same, temp_opp, rope, eps)


def _cpu_trainable(q, k, v, temp_same, temp_opp, rope, eps) -> Tensor:
    """The fused CPU backend under autograd: its analytic backward (:mod:`.cpu_backward`) for inputs
    in the shift-free exponent range; the eager backend's autograd, which follows the exponent shifts,
    for the others and for RoPE tables that record gradients."""
    if any(t.requires_grad for t in rope_tensors(rope)) or exponent_shift_needed(q, k, temp_same, temp_opp):
        return pola_attention_torch(q, k, v, temp_same, temp_opp, rope, eps)
    return pola_attention_cpu_trainable(q, k, v, temp_same, temp_opp, rope, eps)


def _triton_or_torch(q, k, v, temp_same, temp_opp, rope, eps) -> Tensor:
    """``backend='auto'`` on the Triton kernels: the torch backend (after one warning) where they fail."""
    from .triton_ops import TritonKernelError, note_kernel_failure, pola_attention_triton
    try:
        return pola_attention_triton(q, k, v, temp_same, temp_opp, rope, eps, fallback_to_torch=True)
    except TritonKernelError as error:
        note_kernel_failure(q, error)
    return pola_attention_torch(q, k, v, temp_same, temp_opp, rope, eps)


def gated_output(out: Tensor, lepe: Tensor, gate: Tensor) -> Tensor:
    """The attention's epilogue in its plain form: ``(merge_heads(out) + lepe) * gate``.

    Args:
        out: ``(B, h, N, dv)``, the attention output per head.
        lepe, gate: ``(B, N, h * dv)``; channel ``c`` of a token belongs to head ``c // dv``.

    Returns:
        Tensor: ``(B, N, h * dv)``. Differentiable (the reference the fused
        epilogues are held to).
    """
    batch, heads, num_tokens, head_dim = out.shape
    return (out.transpose(1, 2).reshape(batch, num_tokens, heads * head_dim) + lepe) * gate


def _check_epilogue(q: Tensor, v: Tensor, lepe: Tensor, gate: Tensor) -> None:
    batch, heads, num_tokens = q.shape[:3]
    expected = (batch, num_tokens, heads * v.shape[-1])
    for name, t in (('lepe', lepe), ('gate', gate)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise TypeError(f'{name} must be a floating-point torch.Tensor, got '
                            f'{getattr(t, "dtype", type(t).__name__)}')
        if tuple(t.shape) != expected:
            raise ValueError(f'{name} must have shape (B, N, h * dv) = {expected}, got {tuple(t.shape)}')
        if t.device != q.device:
            raise ValueError(f'{name} must be on the device of q ({q.device}), got {t.device}')


def pola_attention_gated(q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor,
                         lepe: Tensor, gate: Tensor, rope: Rope = None, eps: float = 1e-6,
                         backend: str = 'auto', lepe_writable: bool = False) -> Tensor:
    """:func:`pola_attention` with its block's epilogue: ``(merged heads + lepe) * gate`` in the token layout.

    The attention modules add a depthwise-conv term (LePE) to the attention
    output and multiply a gate in before the output projection. Here the fused
    CPU backend folds both into the readout (the products accumulate onto
    ``lepe`` and write the token layout; the gate follows while the rows are
    in cache), so the output never exists per head. The other backends (and
    autograd) compute :func:`gated_output` of :func:`pola_attention`.

    Args:
        q, k, v, temp_same, temp_opp, rope, eps, backend: as :func:`pola_attention`
            (``q``/``k``/``v`` may be strided views of a projection's output).
        lepe, gate: ``(B, N, h * dv)``, channel ``c`` in head ``c // dv``.
        lepe_writable: ``lepe`` is a temporary of the caller's: the fused CPU
            backend may accumulate into its memory (then returned) instead of
            a copy. Default False.

    Returns:
        Tensor: ``(B, N, h * dv)`` in ``q``'s dtype.
    """
    _check_inputs(q, k, v, temp_same, temp_opp, rope, eps, backend)
    _check_epilogue(q, v, lepe, gate)
    records_grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (q, k, v, temp_same, temp_opp, lepe, gate, *rope_tensors(rope)))
    chosen = _pick_backend(q, k, v) if backend == 'auto' else backend
    if chosen == 'cpu' and q.device.type == 'cpu' and not records_grad and cpu_kernels_available() \
            and not is_tracing() and all(t.dtype in FUSED_DTYPES for t in (q, k, v, lepe, gate)):
        rope = as_rope_halves(rope, q.shape[-1], q.device)
        return pola_attention_cpu(q, k, v, temp_same, temp_opp, rope, eps, lepe=lepe, gate=gate,
                                  lepe_writable=lepe_writable)
    out = pola_attention(q, k, v, temp_same, temp_opp, rope=rope, eps=eps, backend=backend)
    return gated_output(out, lepe, gate).to(q.dtype)
