"""Facts and helpers shared by the backends of :func:`~polaformerpp.ops.pola_attention`.

The method itself is written out once, in the package docstring
(:mod:`polaformerpp.ops.pola_attention`).
"""
from typing import List, Optional, Tuple, Union

import torch
from torch import Tensor

from ..rope import RopeGrid, RopeHalves, rope_halves

__all__ = [
    'Rope', 'FUSED_DTYPES', 'compute_dtype', 'is_tracing', 'chunk_tokens', 'token_chunks',
    'signed_temperatures', 'check_temperatures', 'check_rope', 'rope_pair_error', 'check_rope_pairs',
    'as_rope_halves', 'rope_tensors'
]

#: the RoPE forms the op accepts: none, a token grid by its size, or ``(sin, cos)`` tables ``(N, 2d)``
Rope = Union[None, RopeGrid, Tuple[Tensor, Tensor]]

#: input dtypes of the fused backends (computed in fp32)
FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

CHUNK_ELEMENTS = 2 ** 17  # elements of q (B * h * tokens * d) per step of the chunked backends
MIN_CHUNK_TOKENS = 512


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp16/bf16 inputs are computed in fp32 (exp overflows fp16 at 11.1, 1/N
    underflows it at long sequences); fp64 stays fp64 (gradcheck)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def is_tracing() -> bool:
    """Under torch.compile or torch.jit.trace (no data-dependent checks, no opaque kernels)."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def chunk_tokens(q: Tensor) -> int:
    """Tokens per step: ``B * h * n * 4d`` query features stay around 2 MiB (fp32).

    Args:
        q: ``(B, h, N, d)``.
    """
    batch_heads = q.shape[0] * q.shape[1]
    return max(MIN_CHUNK_TOKENS, CHUNK_ELEMENTS // max(batch_heads * q.shape[-1], 1))


def token_chunks(num_tokens: int, chunk_size: int) -> List[Tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``range(num_tokens)`` in steps of ``chunk_size``."""
    return [(start, min(start + chunk_size, num_tokens)) for start in range(0, num_tokens, chunk_size)]


def signed_temperatures(temp_same: Tensor, temp_opp: Tensor) -> Tensor:
    """``(h, 2d)`` x 2 -> ``(h, 4, d)`` rows ``[ts[:d], -ts[d:], -to[:d], to[d:]]``.

    With non-negative temperatures, ``relu(q) * t = relu(q * t)`` and
    ``relu(-q) * t = relu(q * -t)``, so ``exp(relu(q * row)) - 1`` over these
    four rows gives ``[phi_s | phi_o]`` directly.
    """
    d = temp_same.shape[-1] // 2
    return torch.stack([temp_same[:, :d], -temp_same[:, d:], -temp_opp[:, :d], temp_opp[:, d:]], dim=1)


def check_temperatures(temp_same: Tensor, temp_opp: Tensor) -> None:
    """Raise unless both temperatures are non-negative (what :func:`signed_temperatures` relies on)."""
    for name, t in (('temp_same', temp_same), ('temp_opp', temp_opp)):
        if not bool((t >= 0).all()):
            raise ValueError(f'{name} must be non-negative (sigmoid outputs in (0, 1)), '
                             f'got a minimum of {t.min().item():.4g}')


def check_rope(rope: Rope, num_tokens: int, head_dim: int) -> None:
    """Raise unless ``rope`` is one of the accepted forms and fits ``N`` tokens of head dim ``d``."""
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


def rope_pair_error(name: str) -> ValueError:
    """The error for RoPE tables whose rotation pairs ``(2i, 2i+1)`` have two angles."""
    return ValueError(f'{name} must give both channels of a rotation pair '
                      f'(2i, 2i+1) the same angle: t[:, 0::2] == t[:, 1::2]')


def check_rope_pairs(halves: Optional[RopeHalves]) -> None:
    """Raise unless each rotation pair of ``(sin, cos)`` tables shares one angle (grids always do)."""
    if halves is None or halves.grid_width:
        return
    for name, lo, hi in (('rope[0] (sin)', halves.sin_lo, halves.sin_hi),
                         ('rope[1] (cos)', halves.cos_lo, halves.cos_hi)):
        if not all(torch.equal(t[:, 0::2], t[:, 1::2]) for t in (lo, hi)):
            raise rope_pair_error(name)


def as_rope_halves(rope: Union[Rope, RopeHalves], head_dim: int,
                   device: Optional[torch.device] = None) -> Optional[RopeHalves]:
    """The one form every backend reads: ``None`` or a :class:`~polaformerpp.ops.rope.RopeHalves`.

    Idempotent (a ``RopeHalves`` comes back as it is), so the dispatcher
    converts once and a backend called directly converts for itself.
    """
    if rope is None or isinstance(rope, RopeHalves):
        return rope
    return rope_halves(rope, head_dim, device=device)


def rope_tensors(rope: Union[Rope, RopeHalves]) -> Tuple[Tensor, ...]:
    """The tensors of ``rope`` that autograd could record (the caller's tables)."""
    if rope is None or isinstance(rope, RopeGrid):
        return ()
    if isinstance(rope, RopeHalves):
        return tuple(rope[:4])
    return tuple(rope)
