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
from typing import Callable, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .rope import RopeGrid, pola_rope_factors

Rope = Union[None, RopeGrid, Tuple[Tensor, Tensor]]


__all__ = ['pola_attention', 'pola_attention_torch', 'pola_feature_maps', 'available_backends']

_BACKENDS = ('auto', 'torch', 'cpu', 'triton')
_FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def available_backends() -> Tuple[str, ...]:
    """Backends usable in this process (``'cpu'`` needs the compiled kernels,
    ``'triton'`` a CUDA device and Triton)."""
    backends = ['torch']
    if _cpu_kernels_usable():
        backends.append('cpu')
    if _triton_usable():
        backends.append('triton')
    return tuple(backends)


def _cpu_kernels_usable() -> bool:
    from .pola_attention_cpu import cpu_kernels_available
    return cpu_kernels_available()


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


_CHUNK_ELEMENTS = 2 ** 17  # elements of q (B * h * tokens * d) per step of the torch backend
_MIN_CHUNK_TOKENS = 512


def _chunk_tokens(q: Tensor) -> int:
    """Tokens per step: ``B * h * n * 4d`` query features stay around 2 MiB (fp32)."""
    batch_heads = q.shape[0] * q.shape[1]
    return max(_MIN_CHUNK_TOKENS, _CHUNK_ELEMENTS // max(batch_heads * q.shape[-1], 1))


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


def _signed_temperatures(temp_same: Tensor, temp_opp: Tensor) -> Tensor:
    """``(h, 2d)`` x 2 -> ``(h, 4, d)`` rows ``[ts[:d], -ts[d:], -to[:d], to[d:]]``.

    With non-negative temperatures, ``relu(q) * t = relu(q * t)`` and
    ``relu(-q) * t = relu(q * -t)``, so multiplying ``q`` by these rows and
    applying :func:`_spiky` gives ``[phi_s | phi_o]`` directly.
    """
    d = temp_same.shape[-1] // 2
    return torch.stack([temp_same[:, :d], -temp_same[:, d:], -temp_opp[:, :d], temp_opp[:, d:]], dim=1)


def _query_features(q: Tensor, signed_temps: Tensor) -> Tensor:
    """Both streams' query maps: ``(B, h, n, d) -> (B, h, n, 2, 2d)`` (``[phi_s, phi_o]``)."""
    x = q.unsqueeze(-2) * signed_temps[None, :, None]  # (B, h, n, 4, d)
    return _spiky(x).flatten(-2).unflatten(-1, (2, -1))


def _rotation(sin: Tensor, cos: Tensor, dtype: torch.dtype, check: bool) -> Tensor:
    """``(sin, cos)`` rows ``(n, 2d)`` -> unit complex numbers ``(n, d)``, one per channel pair.

    With ``check``, tables whose pairs do not share an angle raise (the
    complex product rotates a pair by one angle).
    """
    if check:
        for name, t in (('rope[0] (sin)', sin), ('rope[1] (cos)', cos)):
            if not torch.equal(t[:, 0::2], t[:, 1::2]):
                raise ValueError(f'{name} must give both channels of a rotation pair '
                                 f'(2i, 2i+1) the same angle: t[:, 0::2] == t[:, 1::2]')
    return torch.complex(cos[:, 0::2].to(dtype), sin[:, 0::2].to(dtype))


def _rotation_source(rope: Rope, head_dim: int, dtype: torch.dtype,
                     device: torch.device) -> Optional[Callable[[int, int, bool], Tensor]]:
    """``rotation(start, stop, check)``: the complex rotations ``(stop - start, d)`` of those tokens.

    Tables ``(sin, cos)`` are read row by row (with ``check``, their pairs are
    checked, see :func:`_rotation`); a :class:`RopeGrid` gathers its row and
    column rotations (``(H, d/2)`` and ``(W, d/2)``, built once).
    """
    if rope is None:
        return None
    if isinstance(rope, RopeGrid):
        row_sin, row_cos, col_sin, col_cos = pola_rope_factors(*rope, head_dim, device=device, dtype=dtype)
        row_rot = torch.complex(row_cos[:, 0::2], row_sin[:, 0::2])
        col_rot = torch.complex(col_cos[:, 0::2], col_sin[:, 0::2])

        def rotation(start, stop, check):
            tokens = torch.arange(start, stop, device=device)
            return torch.cat([row_rot[tokens // rope.width], col_rot[tokens % rope.width]], dim=-1)
        return rotation
    sin, cos = rope
    return lambda start, stop, check: _rotation(sin[start:stop], cos[start:stop], dtype, check)


def _check_temperatures(temp_same: Tensor, temp_opp: Tensor) -> None:
    for name, t in (('temp_same', temp_same), ('temp_opp', temp_opp)):
        if not bool((t >= 0).all()):
            raise ValueError(f'{name} must be non-negative (sigmoid outputs in (0, 1)), '
                             f'got a minimum of {t.min().item():.4g}')


def _rotate(x: Tensor, rotation: Tensor) -> Tensor:
    """RoPE of channel pairs as a complex product: ``(x0 + i x1) * (cos + i sin)``.

    Args:
        x: ``(..., 2c)`` real, contiguous.
        rotation: complex, broadcastable to ``(..., c)``.
    """
    return torch.view_as_real(torch.view_as_complex(x.unflatten(-1, (-1, 2))) * rotation).flatten(-2)


def pola_attention_torch(q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor,
                         rope: Rope = None, eps: float = 1e-6,
                         chunk_size: Optional[int] = None) -> Tensor:
    """PyTorch implementation (no argument checks; see :func:`pola_attention`).

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
    """
    out_dtype = q.dtype
    dtype = _compute_dtype(q.dtype)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    batch, heads, num_tokens, head_dim = q.shape
    half = v.shape[-1] // 2
    chunk_size = chunk_size or _chunk_tokens(q)
    # data-dependent checks cannot be traced (torch.compile, torch.jit.trace)
    check_values = not (torch.compiler.is_compiling() or torch.jit.is_tracing())
    if check_values:
        _check_temperatures(temp_same, temp_opp)
    rotation = _rotation_source(rope, head_dim, dtype, q.device)
    chunks = [(start, min(start + chunk_size, num_tokens)) for start in range(0, num_tokens, chunk_size)]

    # pass 1: keys -> state S and mean feature m
    state, key_sum = 0, 0
    for start, stop in chunks:
        phi_k = _key_features(k[..., start:stop, :])  # (B, h, n, 2d)
        key_sum = key_sum + phi_k.sum(dim=-2)
        if rotation is not None:
            phi_k = _rotate(phi_k, rotation(start, stop, check_values))
        state = state + phi_k.transpose(-1, -2) @ v[..., start:stop, :]
    state = state / num_tokens  # (B, h, 2d, dv); 1/N in the compute dtype
    key_mean = (key_sum / num_tokens)[:, :, None, :, None]  # (B, h, 1, 2d, 1)
    state_same, state_opp = state[..., :half], state[..., half:]

    # pass 2: queries -> both streams at once
    signed_temps = _signed_temperatures(temp_same.to(dtype), temp_opp.to(dtype))
    out = q.new_empty(batch, heads, num_tokens, 2 * half)
    for start, stop in chunks:
        phi_q = _query_features(q[..., start:stop, :], signed_temps)  # (B, h, n, 2, 2d)
        den = phi_q @ key_mean + eps  # (B, h, n, 2, 1)
        if rotation is not None:
            # rebuilt rather than kept from pass 1: an (N, d) complex tensor per call
            # would cost more in fresh memory than the gather costs
            phi_q = _rotate(phi_q, rotation(start, stop, False)[:, None, :])
        num = torch.stack([phi_q[..., 0, :] @ state_same, phi_q[..., 1, :] @ state_opp], dim=-2)
        out[..., start:stop, :] = (num / den).flatten(-2)  # (B, h, n, dv)
    return out.to(out_dtype)


def _rope_tensors(rope: Rope) -> Tuple[Tensor, ...]:
    return tuple(rope) if rope is not None and not isinstance(rope, RopeGrid) else ()


def _pick_backend(q: Tensor, k: Tensor, v: Tensor, records_grad: bool) -> str:
    fused_dtypes = all(t.dtype in _FUSED_DTYPES for t in (q, k, v))
    if q.is_cuda and fused_dtypes and v.shape[-1] == q.shape[-1] and _triton_usable():
        return 'triton'
    # the compiled kernels are opaque to torch.compile and torch.jit.trace (flop counters,
    # export): those see the eager backend
    traced = torch.compiler.is_compiling() or torch.jit.is_tracing()
    if q.device.type == 'cpu' and fused_dtypes and not records_grad and not traced and _cpu_kernels_usable():
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
    if isinstance(rope, RopeGrid):
        for name, value in zip(('height', 'width'), rope):
            # ints, or traced / symbolic sizes under torch.jit.trace and torch.compile
            if isinstance(value, (bool, float)) or int(value) < 1:
                raise ValueError(f'rope.{name} (RopeGrid) must be a positive int, got {value!r}')
        if int(rope.height) * int(rope.width) != num_tokens:
            raise ValueError(f'rope=RopeGrid({rope.height}, {rope.width}) covers '
                             f'{rope.height * rope.width} tokens, q has N={num_tokens}')
    elif rope is not None:
        if not isinstance(rope, (tuple, list)) or len(rope) != 2:
            raise TypeError('rope must be None, a RopeGrid(height, width) or a (sin, cos) pair of tensors')
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
            kernels, forward only), ``'triton'`` (CUDA tensors) or ``'auto'``
            (the fastest one usable for these tensors: triton on CUDA, cpu on
            CPU when autograd does not record, torch otherwise; never fails).

    Returns:
        Tensor: ``(B, h, N, dv)`` in ``q``'s dtype: ``[same-polarity stream
        over v[..., :dv/2] | opposite-polarity stream over v[..., dv/2:]]``.
        Feature maps and accumulation are fp32 for fp16/bf16 inputs.

    Raises:
        TypeError, ValueError: naming the argument and what was expected
            (shapes, dtypes, even head dims, ``backend``; with the torch
            backend also negative temperatures and RoPE tables whose pairs
            differ).
    """
    _check_inputs(q, k, v, temp_same, temp_opp, rope, eps, backend)
    records_grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (q, k, v, temp_same, temp_opp, *_rope_tensors(rope)))
    if backend == 'auto':
        backend = _pick_backend(q, k, v, records_grad)
    if backend == 'cpu':
        if q.device.type != 'cpu' or q.dtype not in _FUSED_DTYPES or not _cpu_kernels_usable():
            raise ValueError("backend='cpu' needs CPU tensors in fp32/fp16/bf16 and the compiled "
                             "kernels (tools/setup_env.sh builds them); use backend='torch' or 'auto'")
        if records_grad:
            raise ValueError("backend='cpu' is forward only and autograd is recording: use "
                             "backend='torch' or 'auto' to train, or torch.no_grad() / inference_mode()")
        from .pola_attention_cpu import pola_attention_cpu
        return pola_attention_cpu(q, k, v, temp_same, temp_opp, rope, eps)
    if backend == 'triton':
        if not _triton_usable():
            raise ValueError("backend='triton' is not available in this build: "
                             "use backend='torch' or 'auto'")
        from .pola_attention_triton import pola_attention_triton
        return pola_attention_triton(q, k, v, temp_same, temp_opp, rope, eps)
    return pola_attention_torch(q, k, v, temp_same, temp_opp, rope, eps)
