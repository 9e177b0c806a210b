"""Facts and helpers shared by the backends of :func:`~polaformerpp.ops.pola_attention`.

The method itself is written out once, in the package docstring
(:mod:`polaformerpp.ops.pola_attention`).

Exponent shifts
---------------
``exp(x) - 1`` overflows float32 at ``x ~ 88.7``, and products of a query's
and a key's features much earlier. The output is unchanged when each key
feature channel ``c`` is scaled by ``exp(-L_c)`` (the same ``L`` for both
channels of a RoPE pair) and each query's channel ``c`` of one stream by
``exp(L_c - c_q)``, with ``eps`` carried as ``eps * exp(-c_q)``: numerator and
denominator both scale by ``exp(-c_q)``. Where the inputs need it the backends
use

* key shifts ``b = relu(max_n [k+, k-]_n - 20)`` per ``(B, h)`` and channel
  (with RoPE, pairs share the larger value): shifted key features ``exp(x -
  b) - exp(-b)`` stay below ``exp(20)`` (:func:`key_exponent_shifts`);
* the shifted mean ``r`` of each channel (with RoPE, the larger of each pair):
  the state and the key mean are divided by it, so ``m'' <= 1`` and the
  queries carry the keys' scale ``L = b + log r`` (:func:`key_normalisation`);
* per token and stream ``c_q = max(relu(max_c(x_c + L_c + log m''_c) - 40),
  max_c(x_c + L_c) - 70)`` over the query exponents ``x``: the denominator's
  largest term stays near ``exp(40)`` at most and every query feature
  ``exp(x + L - c_q) - exp(L - c_q)`` below ``exp(70)``
  (:func:`query_exponent_shifts`).

Exact zeros stay exact zeros. Inputs whose exponents stay in the shift-free
range (every key exponent <= 20, query plus key exponent <= 40:
:func:`needs_exponent_shift`) take the unshifted arithmetic, unchanged;
under tracing the shifted path (the same values in that range, to rounding)
always runs.
"""
from typing import Dict, List, Optional, Tuple, Union

import torch
from torch import Tensor

from ..rope import RopeGrid, RopeHalves, rope_halves
from ..tracing import is_tracing

__all__ = [
    'Rope', 'FUSED_DTYPES', 'MAX_TRITON_BATCH_HEADS', 'compute_dtype', 'is_tracing', 'chunk_tokens', 'token_chunks',
    'signed_temperatures', 'check_temperatures', 'check_rope', 'rope_pair_error', 'check_rope_pairs',
    'as_rope_halves', 'rope_tensors', 'SHIFT_FREE_KEY_EXPONENT', 'SHIFT_FREE_PRODUCT_EXPONENT', 'MAX_QUERY_EXPONENT',
    'needs_exponent_shift', 'exceeds_shift_free_range', 'key_exponent_shifts', 'key_normalisation',
    'query_exponent_shifts', 'signed_rows', 'shifted_eps'
]

#: the RoPE forms the op accepts: none, a token grid by its size, or ``(sin, cos)`` tables ``(N, 2d)``
Rope = Union[None, RopeGrid, Tuple[Tensor, Tensor]]

#: input dtypes of the fused backends (computed in fp32)
FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: CUDA's limit of a grid's second axis, over which the Triton kernels spread ``B * h``
MAX_TRITON_BATCH_HEADS = 65535

CHUNK_ELEMENTS = 2 ** 17  # elements of q (B * h * tokens * d) per step of the chunked backends
MIN_CHUNK_TOKENS = 512


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp16/bf16 inputs are computed in fp32 (exp overflows fp16 at 11.1, 1/N
    underflows it at long sequences); fp64 stays fp64 (gradcheck)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


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


#: key exponents up to this are used unshifted (``exp(20) ~ 4.9e8``)
SHIFT_FREE_KEY_EXPONENT = 20.0
#: a query exponent plus ``log`` of the key mean up to this is used unshifted (``exp(40) ~ 2.4e17``)
SHIFT_FREE_PRODUCT_EXPONENT = 40.0
#: shifted query features stay below ``exp(70)`` (fp32 holds ``exp(88.7)``; room for the numerator's sum)
MAX_QUERY_EXPONENT = 70.0


def _abs_max(t: Tensor) -> Tensor:
    """``max |t|`` without an ``abs`` temporary, fp32 (NaN propagates).

    Reduced over the last dim first: the inputs are often strided views of a
    projection's output, which a whole-tensor reduction would copy first.
    """
    t = t.detach()
    return torch.maximum(t.amin(-1).amin().neg(), t.amax(-1).amax()).float()


def needs_exponent_shift(q: Tensor, k: Tensor, temp_same: Tensor, temp_opp: Tensor) -> bool:
    """Whether any exponent of these inputs may leave the shift-free range (one sync; ``True`` under tracing).

    Bound: the key mean is below ``exp(max |k|)``, the query exponents below
    ``max |q| * max t``. ``False`` guarantees ``b = c_q = 0`` everywhere.
    NaN/inf inputs take the unshifted path (they propagate there as before).

    Args:
        q, k: ``(B, h, N, d)``; temp_same, temp_opp: ``(h, 2d)``.
    """
    if is_tracing():
        return True
    with torch.no_grad():
        return exceeds_shift_free_range(_abs_max(k), _abs_max(q), temp_same, temp_opp)


def exceeds_shift_free_range(key_top, query_top, temp_same: Tensor, temp_opp: Tensor) -> bool:
    """The bound of :func:`needs_exponent_shift` from ``max |k|`` and ``max |q|`` (floats or
    0-dim tensors; NaN compares false)."""
    top_temperature = torch.maximum(temp_same.detach().amax(), temp_opp.detach().amax()).float()
    product_top = key_top + query_top * top_temperature
    return bool((key_top > SHIFT_FREE_KEY_EXPONENT) | (product_top > SHIFT_FREE_PRODUCT_EXPONENT))


def _share_pairs(channels: Tensor) -> Tensor:
    """``(..., 2d)`` -> the larger value of each channel pair ``(2i, 2i+1)`` in both channels."""
    top = channels.unflatten(-1, (-1, 2)).amax(dim=-1, keepdim=True)
    return top.expand(*top.shape[:-1], 2).flatten(-2)


def key_exponent_shifts(k: Tensor, pairs: bool = True) -> Tensor:
    """Key shifts ``b = relu(max_n [k+, k-] - 20)`` per channel.

    Args:
        k: ``(B, h, N, d)`` (read without autograd: the shifts are constants).
        pairs: both channels of a RoPE pair take the larger shift (needed when
            the features are rotated; per channel otherwise).

    Returns:
        Tensor: ``(B, h, 2d)`` in ``k``'s dtype, channels ``[k+ | k-]`` as the key features.
    """
    k = k.detach()
    top = torch.cat([k.amax(dim=-2).clamp_min(0), k.amin(dim=-2).neg().clamp_min(0)], dim=-1)
    if pairs:
        top = _share_pairs(top)
    return (top - SHIFT_FREE_KEY_EXPONENT).clamp_min(0)


def key_normalisation(key_shifts: Tensor, key_mean: Tensor, pairs: bool = True) -> Tuple[Tensor, Tensor]:
    """Per-channel divisors that bring the shifted key mean to at most 1.

    ``r`` is the shifted mean ``m'`` of each channel (with ``pairs``, the larger
    of each RoPE pair): the state and the key mean are divided by ``r``
    (channels with ``r == 0`` have no active key: divide by 1, they stay zero)
    and the queries multiplied by ``exp(b + log r)``, so the queries carry the
    whole scale of the keys and ``m'' <= 1``.

    Args:
        key_shifts: ``(B, h, 2d)`` from :func:`key_exponent_shifts` (with the same ``pairs``).
        key_mean: ``(B, h, 2d)``, the mean of the shifted key features ``m'``.
        pairs: both channels of a RoPE pair share one divisor (needed when the
            features are rotated).

    Returns:
        tuple[Tensor, Tensor]: ``key_divisor`` ``(B, h, 2d)`` (``r``, or 1) and
        ``log_scale`` ``(B, h, 2d)`` (``b + log r``, ``-inf`` where ``r == 0``), no autograd history.
    """
    top = key_mean.detach()
    if pairs:
        top = _share_pairs(top)
    key_divisor = torch.where(top > 0, top, torch.ones_like(top))
    return key_divisor, key_shifts.detach() + top.log()


def query_exponent_shifts(exponents: Tensor, log_rows: Tensor, log_mean_rows: Tensor) -> Tensor:
    """Query shifts ``c_q`` per token and stream (see the module docstring).

    ``c_q = max(relu(max_c(relu(x_c) + L_c + log m''_c) - 40), max_c(relu(x_c) + L_c) - 70)``: every
    term of the denominator stays below ``exp(40)`` (the largest one near it)
    and every shifted query feature below ``exp(70)``.

    Args:
        exponents: ``(B, h, n, 4, d)``, ``q`` times the signed temperature rows.
        log_rows: ``(B, h, 4, d)``, the queries' log scale ``L`` per row (:func:`signed_rows`).
        log_mean_rows: ``(B, h, 4, d)``, ``log m''`` per row (``-inf`` where ``m''`` is 0).

    Returns:
        Tensor: ``(B, h, n, 2)`` (same, opposite stream), no autograd history.
    """
    scaled = exponents.detach().clamp_min(0) + log_rows[:, :, None]
    top_term = (scaled + log_mean_rows[:, :, None]).unflatten(-2, (2, 2)).amax(dim=(-2, -1))
    top_feature = scaled.unflatten(-2, (2, 2)).amax(dim=(-2, -1))
    return torch.maximum((top_term - SHIFT_FREE_PRODUCT_EXPONENT).clamp_min(0),
                         top_feature - MAX_QUERY_EXPONENT)


def signed_rows(channels: Tensor) -> Tensor:
    """Key-channel values ``(B, h, 2d)`` laid out like the signed temperature rows: ``(B, h, 4, d)``.

    Rows 0-1 (same stream) and 2-3 (opposite stream) read key channels
    ``[0, d)`` and ``[d, 2d)`` (:func:`signed_temperatures`).
    """
    return channels.unflatten(-1, (2, -1)).repeat(1, 1, 2, 1)


def shifted_eps(eps: float, query_shifts: Tensor) -> Tensor:
    """``eps * exp(-c_q)``, kept at least the dtype's smallest normal number when ``eps > 0``.

    The floor only matters once ``eps * exp(-c_q)`` underflows (``c_q`` beyond
    ~70 in fp32); it keeps an all-zero query's output exactly zero (``0 / eps'``).
    """
    shifted = eps * torch.exp(-query_shifts)
    return shifted.clamp_min(torch.finfo(query_shifts.dtype).tiny) if eps > 0 else shifted


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
            # ints, or traced / symbolic sizes under torch.jit.trace, torch.compile and torch.export
            # (compared, not converted: int() would fix a symbolic size to its traced value)
            if isinstance(value, (bool, float)) or value < 1:
                raise ValueError(f'rope.{name} (RopeGrid) must be a positive int, got {value!r}')
        if rope.height * rope.width != num_tokens:
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
    on_cpu = device is None or torch.device(device).type == 'cpu'
    if isinstance(rope, RopeGrid) and on_cpu and not is_tracing():  # the same few grids every step
        key = (*rope, head_dim)
        if key not in _GRID_HALVES:
            if len(_GRID_HALVES) >= 64:
                _GRID_HALVES.clear()
            with torch.inference_mode(False):  # normal tensors, which autograd may save later
                _GRID_HALVES[key] = rope_halves(rope, head_dim)
        return _GRID_HALVES[key]
    return rope_halves(rope, head_dim, device=device)


# RopeGrid -> RopeHalves on the CPU (read-only tables, shared between calls)
_GRID_HALVES: Dict[Tuple[int, int, int], RopeHalves] = {}


def rope_tensors(rope: Union[Rope, RopeHalves]) -> Tuple[Tensor, ...]:
    """The tensors of ``rope`` that autograd could record (the caller's tables)."""
    if rope is None or isinstance(rope, RopeGrid):
        return ()
    if isinstance(rope, RopeHalves):
        return tuple(rope[:4])
    return tuple(rope)
