"""Triton kernels of the fused backend of :func:`~polaformerpp.ops.pola_attention`.

The method is written out in the package docstring
(:mod:`polaformerpp.ops.pola_attention`); for one batch element and head the
kernels compute it with ``q, k, v`` ``(N, d)`` (``dv == d``), writing stream
``s`` (``0``: same polarity, ``x = q``, ``t = temp_same``; ``1``: opposite,
``x = -q``, ``t = temp_opp``, since ``[q-, q+] = [(-q)+, (-q)-]``) into value
channels ``[s d/2, (s+1) d/2)``. The host side (launches, autograd, custom ops)
is :mod:`.triton_ops`.

Decomposition
-------------
* **Channel quads.** A ``2d``-channel feature map is never materialised. Every
  kernel loads the even and the odd channels of ``q``/``k`` (``2i`` and
  ``2i + 1``, ``i < d/2``) as two ``(BLOCK_N, BLOCK_D)`` tiles
  (``BLOCK_D = next_pow2(d/2)``, at least 16, zero-padded) and derives four
  feature tiles from them: positive-even, positive-odd, negative-even,
  negative-odd (feature channels ``2i``, ``2i+1``, ``d+2i``, ``d+2i+1``). Only
  one of ``x+``, ``x-`` is non-zero, so one ``exp`` per input element gives
  both polarities. A RoPE pair ``(2i, 2i+1)`` is then an element-wise
  combination of the even and odd tiles, so no register shuffles are needed.
  The state ``S`` is kept as ``2 streams x 4 quads`` blocks of
  ``(BLOCK_D, BLOCK_D)`` (rows: feature channels of one quad, columns: the
  value channels of one stream).
* **Forward, phase 1** (:func:`fwd_state_kernel`): programs ``(chunk, stream,
  batch*head)``; each sums ``R(phi_k)^T v_s`` and ``phi_k`` over its chunk of
  tokens (a few thousand tokens on a GPU, so one long sequence still fills the
  device) into a small fp32 workspace; ``torch.sum`` over the chunks and one
  fp32 division by ``N`` give ``S`` and ``m`` (deterministic, no atomics).
* **Forward, phase 2** (:func:`fwd_out_kernel`): programs ``(tile, stream,
  batch*head)``; each reads its ``q`` tile, builds ``phi_q``, the
  denominator and ``R(phi_q)``, multiplies by the stream's half of ``S`` and
  writes its half of ``o``. The two stream programs of a tile are adjacent in
  launch order, so the second read of the ``q`` tile is normally an L2 hit.
* **Backward** recomputes every feature map; the only saved tensors besides
  the inputs are ``S`` and ``m`` (``O(B h d^2)``). With ``g = do_s``:
  ``dnum = g / den``, ``dden = -sum(g * o_s) / den``,
  ``dS_s = R(phi_q)^T dnum`` and ``dm = sum_s phi_q^T dden`` (reductions over
  ``N``, :func:`bwd_state_kernel`, chunked like phase 1);
  ``dphi_q = R^T(dnum S_s^T) + dden m`` gives ``dq`` and the temperature
  gradients (:func:`bwd_query_kernel`, both streams per program, temperature
  partial sums per chunk reduced with torch over chunks and the batch);
  ``dphi_k = R^T(sum_s v_s dS_s^T / N) + dm / N`` gives ``dk`` and
  ``dv_s = R(phi_k) dS_s / N`` (:func:`bwd_key_value_kernel`).
  The derivative of ``phi = exp(t x) - 1`` is ``t (phi + 1)`` (and ``x (phi + 1)``
  for ``t``), so it is read off the recomputed feature.

Numerics: inputs of any of fp32/fp16/bf16 are converted to fp32 on load; the
feature maps, the accumulations, ``1/N`` and the division are fp32; the
output is stored in ``q``'s dtype. ``exp(x) - 1`` uses a Taylor polynomial
below 0.1 (``tl.exp(x) - 1`` would lose relative precision near 0, and
libdevice's ``expm1`` does not run under ``TRITON_INTERPRET=1``). Matrix
products take ``PRECISION`` (``tl.dot``'s ``input_precision``, chosen by the
host); the interpreter computes them in plain fp32.

Exponent shifts (see :mod:`.common`): with ``SHIFTED`` the kernels compute
the scaled features the other backends use, ``exp(x - b) - exp(-b)`` for the
keys (``b`` per ``(B, h)`` and channel) and ``exp(x + L - c) - exp(L - c)``
for the queries, with ``c`` (:func:`~.common.query_exponent_shifts`) computed
per token and stream inside the query kernels (forward and backward alike)
and ``eps * exp(-c)`` in the denominator; the host computes ``b``, the key
divisors ``r`` and ``L = b + log r`` between the two phases and hands them
over in one ``(B h, 4, 4, BLOCK_D)`` fp32 tensor (:data:`SCALE_SLOTS`). All of
them are constants for the gradients. The derivative of such a feature is
``f + exp(offset)`` (``f + 1`` unshifted), again read off the recomputed one.
Without ``SHIFTED`` (every input in the shift-free range) the arithmetic is
that of the unshifted method.

RoPE: the kernels read a :class:`~polaformerpp.ops.rope.RopeHalves` as four
``(rows, d)`` fp32 tables (``ROPE_GRID``: token ``n`` uses row ``n // W`` for
feature channels ``[0, d)`` and row ``n % W`` for ``[d, 2d)``, ``(H + W) d``
values that stay in L1/L2, instead of streaming two ``(N, 2d)`` tables from
HBM, 8x the bytes of bf16 ``q``; otherwise row ``n`` of the halves of
``(N, 2d)`` tables).

Layouts: ``q``, ``k``, ``v`` and the output gradient may have any strides (the
backbone's ``(B, N, h, d)`` buffer viewed as ``(B, h, N, d)`` needs no copy);
outputs and input gradients are contiguous ``(B, h, N, d)``.

Under ``TRITON_INTERPRET=1`` (CPU tensors, used by the tests; the variable must
be set before ``triton`` is imported) one fixed small configuration runs; on a
GPU the block size, warps and stages are autotuned (:func:`kernel_configs`,
the first time each head dim / RoPE form / dtype runs), or fixed for a block of
code with :func:`fixed_config`.
"""
import contextlib
import os
from typing import Iterator, List, Optional

import torch
import triton
import triton.language as tl

from .common import MAX_QUERY_EXPONENT, SHIFT_FREE_PRODUCT_EXPONENT

__all__ = [
    'INTERPRET', 'NUM_QUADS', 'NUM_STREAMS', 'MAX_BLOCK_N', 'INTERPRET_CHUNK_LEN', 'KERNELS', 'IO_POINTERS',
    'SCALE_SLOTS', 'GPU_CONFIG_SHAPES', 'block_d', 'kernel_configs', 'fixed_config', 'fwd_state_kernel',
    'fwd_out_kernel', 'bwd_state_kernel', 'bwd_query_kernel', 'bwd_key_value_kernel'
]

#: kernels run by the Triton interpreter on CPU tensors (fixed when triton is imported)
INTERPRET = os.environ.get('TRITON_INTERPRET', '0') == '1'
NUM_QUADS = 4          # feature channel groups: +even, +odd, -even, -odd
NUM_STREAMS = 2        # same-polarity, opposite-polarity
MAX_BLOCK_N = 128      # largest token tile of the GPU configs; chunk lengths are multiples of it
_INTERPRET_BLOCK_N = 16
INTERPRET_CHUNK_LEN = 32  # two tiles per chunk: the tests exercise the chunk loop and the reduction
#: the quads of the ``(B h, 4, 4, BLOCK_D)`` scale tensor of the shifted kernels: key shifts ``b``,
#: key divisors ``r``, the queries' log scale ``L = b + log r`` and ``log m''`` (``-inf`` where zero or padded)
SCALE_SLOTS = dict(key_shift=0, key_divisor=1, log_scale=2, log_mean=3)
_KEY_SHIFT: tl.constexpr = tl.constexpr(SCALE_SLOTS['key_shift'])
_LOG_SCALE: tl.constexpr = tl.constexpr(SCALE_SLOTS['log_scale'])
_LOG_MEAN: tl.constexpr = tl.constexpr(SCALE_SLOTS['log_mean'])
_PRODUCT_EXPONENT: tl.constexpr = tl.constexpr(SHIFT_FREE_PRODUCT_EXPONENT)
_MAX_QUERY_EXPONENT: tl.constexpr = tl.constexpr(MAX_QUERY_EXPONENT)
_FP32_TINY: tl.constexpr = tl.constexpr(torch.finfo(torch.float32).tiny)  # the floor of .common.shifted_eps


def block_d(head_dim: int) -> int:
    """Padded width of one channel quad: ``next_pow2(d/2)``, at least 16 (``tl.dot``'s minimum)."""
    return max(16, triton.next_power_of_2(head_dim // 2))



#: ``(BLOCK_N, num_warps, num_stages)`` the autotuner tries on a GPU
GPU_CONFIG_SHAPES = ((16, 4, 1), (32, 4, 1), (32, 8, 2), (64, 4, 2), (64, 8, 1), (64, 8, 2), (128, 8, 2))
#: most fp32 values of one ``(BLOCK_N, BLOCK_D)`` tile per thread: the kernels keep about a dozen
#: such tiles live (quads of features, rotations, gradients), so larger tiles spill registers (and
#: take minutes to build) at d = 96/128
MAX_TILE_VALUES_PER_THREAD = 16


def _fits(block_n: int, num_warps: int, block_width: int) -> bool:
    return block_n * block_width <= MAX_TILE_VALUES_PER_THREAD * 32 * num_warps


#: integer arguments Triton must not specialise on (``== 1``, divisibility): sizes used only in masks,
#: loop bounds and index arithmetic; specialising would build the kernels again for every new N
_SIZE_ARGS = ['seq_len', 'num_heads', 'rope_width', 'chunk_len']


def kernel_configs(head_dim: Optional[int] = None) -> List[triton.Config]:
    """The configurations the autotuner tries: one small one under the interpreter; on a GPU
    :data:`GPU_CONFIG_SHAPES`, for ``head_dim`` those whose tiles fit the registers
    (:data:`MAX_TILE_VALUES_PER_THREAD`)."""
    if INTERPRET:
        return [triton.Config({'BLOCK_N': _INTERPRET_BLOCK_N}, num_warps=1, num_stages=1)]
    shapes = [s for s in GPU_CONFIG_SHAPES if head_dim is None or _fits(s[0], s[1], block_d(head_dim))]
    return [triton.Config({'BLOCK_N': bn}, num_warps=w, num_stages=st) for bn, w, st in shapes]


def _prune_configs(configs, named_args, **meta):
    """The autotuner's pruning hook: the configurations of :func:`kernel_configs` for this head dim."""
    fitting = [c for c in configs if _fits(c.kwargs['BLOCK_N'], c.num_warps, meta['BLOCK_D'])]
    return fitting or configs[:1]


def _autotune(kernel):
    """Autotune ``BLOCK_N``/warps/stages per head dim, RoPE and dtypes (one config if interpreted)."""
    return triton.autotune(configs=kernel_configs(), key=['HEAD_DIM', 'HAS_ROPE', 'ROPE_GRID'],
                           prune_configs_by=dict(early_config_prune=_prune_configs))(kernel)


@contextlib.contextmanager
def fixed_config(block_n: int = 32, num_warps: int = 4, num_stages: int = 1) -> Iterator[triton.Config]:
    """Run every kernel with one configuration inside the block (no autotuning, one build per
    specialisation): tests that sweep many shapes, and checks of each configuration in turn.

    Not thread-safe (it swaps the configurations of the process-wide autotuners).
    """
    config = triton.Config({'BLOCK_N': block_n}, num_warps=num_warps, num_stages=num_stages)
    saved = {name: kernel.configs for name, kernel in KERNELS.items()}
    try:
        for kernel in KERNELS.values():
            kernel.configs = [config]
        yield config
    finally:
        for name, kernel in KERNELS.items():
            kernel.configs = saved[name]


# ----------------------------------------------------------------------------
# Element-wise building blocks (all tiles fp32).
# ----------------------------------------------------------------------------


@triton.jit
def _expm1_taylor(x):
    """Degree-6 Taylor polynomial of ``exp(x) - 1`` (relative error < 1e-9 for ``0 <= x < 0.1``)."""
    return x * (1.0 + x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0 + x * (1.0 / 120.0 + x * (1.0 / 720.0))))))


@triton.jit
def _expm1_nonneg(x):
    """``exp(x) - 1`` for ``x >= 0``; the Taylor polynomial below 0.1."""
    return tl.where(x < 0.1, _expm1_taylor(x), tl.exp(x) - 1.0)


@triton.jit
def _expm1_scaled(x, offset):
    """``exp(offset) (exp(x) - 1)`` for ``x >= 0`` as ``exp(x + offset) - exp(offset)`` (finite
    wherever the result is; the Taylor polynomial times ``exp(offset)`` below 0.1).

    Returns the value and ``exp(offset)`` (the derivative is their sum).
    """
    scale = tl.exp(offset)
    small = scale * _expm1_taylor(tl.minimum(x, 0.1))  # (clamped: no overflow on the lanes not taken)
    value = tl.where(x < 0.1, small, tl.maximum(tl.exp(x + offset) - scale, 0.0))
    return value, scale


@triton.jit
def _polar_features(x, t_pos, t_neg):
    """``(exp(x+ t_pos) - 1, exp(x- t_neg) - 1)`` with a single exp per element.

    ``x``: ``(BLOCK_N, BLOCK_D)``; ``t_pos``, ``t_neg``: broadcastable to it.
    """
    is_pos = x > 0
    feat = _expm1_nonneg(tl.abs(x) * tl.where(is_pos, t_pos, t_neg))
    return tl.where(is_pos, feat, 0.0), tl.where(x < 0, feat, 0.0)


@triton.jit
def _scaled_polar_features(x, t_pos, t_neg, offset_pos, offset_neg):
    """:func:`_polar_features` times ``exp(offset)`` of the active polarity (:func:`_expm1_scaled`).

    Returns both features and the tile of ``exp(offset)`` of the active side.
    """
    is_pos = x > 0
    feat, scale = _expm1_scaled(tl.abs(x) * tl.where(is_pos, t_pos, t_neg), tl.where(is_pos, offset_pos, offset_neg))
    return tl.where(is_pos, feat, 0.0), tl.where(x < 0, feat, 0.0), scale


@triton.jit
def _polar_features_backward(x, f_pos, f_neg, g_pos, g_neg, t_pos, t_neg, scale):
    """Gradients through :func:`_polar_features` (``scale = 1``) or :func:`_scaled_polar_features`.

    ``d/dx (s (exp(t x) - 1)) = t (f + s)`` and ``d/dt = x (f + s)`` on the active side.

    Returns: ``dx`` ``(BLOCK_N, BLOCK_D)``, ``dt_pos`` and ``dt_neg`` ``(BLOCK_D,)``
    (summed over the tile's rows).
    """
    g_pos = tl.where(x > 0, g_pos * (f_pos + scale), 0.0)   # dL/d(t_pos x+)
    g_neg = tl.where(x < 0, g_neg * (f_neg + scale), 0.0)   # dL/d(t_neg x-)
    dx = g_pos * t_pos - g_neg * t_neg
    return dx, tl.sum(g_pos * x, axis=0), tl.sum(-g_neg * x, axis=0)


@triton.jit
def _rotate(even, odd, sin_e, sin_o, cos_e, cos_o):
    """RoPE of channel pairs: ``(x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin)``."""
    return even * cos_e - odd * sin_e, odd * cos_o + even * sin_o


@triton.jit
def _rotate_transposed(g_even, g_odd, sin_e, sin_o, cos_e, cos_o):
    """Transpose of :func:`_rotate` (maps a gradient w.r.t. the rotated pair back)."""
    return g_even * cos_e + g_odd * sin_o, g_odd * cos_o - g_even * sin_e


@triton.jit
def _rotate_quads(f, rope, TRANSPOSED: tl.constexpr):
    """Apply (the transpose of) the rotation to a quad ``(+even, +odd, -even, -odd)``.

    ``rope`` is ``(sin quad, cos quad)`` of the same tiles.
    """
    sin, cos = rope[0], rope[1]
    if TRANSPOSED:
        pe, po = _rotate_transposed(f[0], f[1], sin[0], sin[1], cos[0], cos[1])
        ne, no = _rotate_transposed(f[2], f[3], sin[2], sin[3], cos[2], cos[3])
    else:
        pe, po = _rotate(f[0], f[1], sin[0], sin[1], cos[0], cos[1])
        ne, no = _rotate(f[2], f[3], sin[2], sin[3], cos[2], cos[3])
    return pe, po, ne, no


@triton.jit
def _key_features(k_even, k_odd, shifts, SHIFTED: tl.constexpr):
    """Key feature quad ``exp([k+, k-]) - 1`` (no temperature), with ``SHIFTED`` ``exp([k+, k-] - b) - exp(-b)``.

    ``shifts``: the quad of ``b`` (``(BLOCK_D,)`` vectors; unused without ``SHIFTED``).
    Returns the quad and the ``exp(-b)`` tiles of the even and odd inputs (``1.0`` unshifted).
    """
    if SHIFTED:
        pe, ne, scale_even = _scaled_polar_features(k_even, 1.0, 1.0, -shifts[0][None, :], -shifts[2][None, :])
        po, no, scale_odd = _scaled_polar_features(k_odd, 1.0, 1.0, -shifts[1][None, :], -shifts[3][None, :])
    else:
        pe, ne = _polar_features(k_even, 1.0, 1.0)
        po, no = _polar_features(k_odd, 1.0, 1.0)
        scale_even = 1.0
        scale_odd = 1.0
    return (pe, po, ne, no), (scale_even, scale_odd)


@triton.jit
def _query_shifts(x, t, log_scale, log_mean):
    """``c`` per row of one stream (:func:`~.common.query_exponent_shifts`): ``(BLOCK_N,)``.

    ``max(relu(max_c(z_c + L_c + log m_c) - 40), max_c(z_c + L_c) - 80)`` over
    the stream's ``2d`` channels, ``z`` the exponents ``[x+, x-] * t`` (zero on
    the inactive side); ``L`` and ``log m`` are ``-inf`` on padded channels.
    """
    exponents = (tl.where(x[0] > 0, x[0] * t[0][None, :], 0.0), tl.where(x[1] > 0, x[1] * t[1][None, :], 0.0),
                 tl.where(x[0] < 0, -x[0] * t[2][None, :], 0.0), tl.where(x[1] < 0, -x[1] * t[3][None, :], 0.0))
    scaled = exponents[0] + log_scale[0][None, :]
    top_feature = tl.max(scaled, axis=1)
    top_term = tl.max(scaled + log_mean[0][None, :], axis=1)
    for j in tl.static_range(1, 4):
        scaled = exponents[j] + log_scale[j][None, :]
        top_feature = tl.maximum(top_feature, tl.max(scaled, axis=1))
        top_term = tl.maximum(top_term, tl.max(scaled + log_mean[j][None, :], axis=1))
    return tl.maximum(tl.maximum(top_term - _PRODUCT_EXPONENT, 0.0), top_feature - _MAX_QUERY_EXPONENT)


@triton.jit
def _query_features(x_even, x_odd, t, scales, SHIFTED: tl.constexpr):
    """Query feature quad ``exp([x+, x-] * t) - 1``; ``t`` is a quad of ``(BLOCK_D,)`` vectors.

    With ``SHIFTED`` (``scales``: the quads of ``L`` and ``log m``) the features
    are ``exp([x+, x-] * t + L - c) - exp(L - c)`` with ``c`` from :func:`_query_shifts`.
    Returns the quad, the ``exp(L - c)`` tiles of the even and odd inputs (``1.0``
    unshifted) and the denominator's ``eps`` factor ``exp(-c)`` per row (``1.0`` unshifted).
    """
    if SHIFTED:
        log_scale = scales[0]
        shifts = _query_shifts((x_even, x_odd), t, log_scale, scales[1])
        offset = -shifts[:, None]
        pe, ne, scale_even = _scaled_polar_features(x_even, t[0][None, :], t[2][None, :],
                                                    log_scale[0][None, :] + offset, log_scale[2][None, :] + offset)
        po, no, scale_odd = _scaled_polar_features(x_odd, t[1][None, :], t[3][None, :],
                                                   log_scale[1][None, :] + offset, log_scale[3][None, :] + offset)
        eps_factor = tl.exp(-shifts)
    else:
        pe, ne = _polar_features(x_even, t[0][None, :], t[2][None, :])
        po, no = _polar_features(x_odd, t[1][None, :], t[3][None, :])
        scale_even = 1.0
        scale_odd = 1.0
        eps_factor = 1.0
    return (pe, po, ne, no), (scale_even, scale_odd), eps_factor


@triton.jit
def _row_dot(f, m):
    """``sum_c f[n, c] m[c]`` over the four quads: ``(BLOCK_N,)``."""
    acc = f[0] * m[0][None, :] + f[1] * m[1][None, :] + f[2] * m[2][None, :] + f[3] * m[3][None, :]
    return tl.sum(acc, axis=1)


# ----------------------------------------------------------------------------
# Loads and stores.
# ----------------------------------------------------------------------------


@triton.jit
def _batch_and_head(bh, num_heads):
    """Split the (int64) ``B * h`` program index into batch element and head."""
    return bh // num_heads, bh % num_heads


@triton.jit
def _load_pair(base, offs_n, offs_i, mask_n, mask_i, stride_n, stride_d):
    """Even and odd channels ``(2i, 2i+1)`` of rows ``offs_n``: two fp32 ``(BLOCK_N, BLOCK_D)`` tiles."""
    rows = base + offs_n[:, None] * stride_n
    mask = mask_n[:, None] & mask_i[None, :]
    even = tl.load(rows + (2 * offs_i)[None, :] * stride_d, mask=mask, other=0.0)
    odd = tl.load(rows + (2 * offs_i + 1)[None, :] * stride_d, mask=mask, other=0.0)
    return even.to(tl.float32), odd.to(tl.float32)


@triton.jit
def _load_cols(base, offs_n, offs_i, mask_n, mask_i, stride_n, stride_d):
    """Channels ``offs_i`` of rows ``offs_n``: one fp32 ``(BLOCK_N, BLOCK_D)`` tile."""
    ptrs = base + offs_n[:, None] * stride_n + offs_i[None, :] * stride_d
    return tl.load(ptrs, mask=mask_n[:, None] & mask_i[None, :], other=0.0).to(tl.float32)


@triton.jit
def _store_cols(base, value, offs_n, offs_i, mask_n, mask_i, stride_n, stride_d):
    ptrs = base + offs_n[:, None] * stride_n + offs_i[None, :] * stride_d
    tl.store(ptrs, value.to(base.dtype.element_ty), mask=mask_n[:, None] & mask_i[None, :])


@triton.jit
def _store_pair(base, even, odd, offs_n, offs_i, mask_n, mask_i, stride_n, stride_d):
    _store_cols(base, even, offs_n, 2 * offs_i, mask_n, mask_i, stride_n, stride_d)
    _store_cols(base, odd, offs_n, 2 * offs_i + 1, mask_n, mask_i, stride_n, stride_d)


@triton.jit
def _load_rope(sin_lo_ptr, cos_lo_ptr, sin_hi_ptr, cos_hi_ptr, rope_width, stride_lo, stride_hi,
               offs_n, offs_i, mask_n, mask_i, ROPE_GRID: tl.constexpr):
    """``(sin quad, cos quad)`` of tokens ``offs_n``.

    The ``lo`` tables rotate feature channels ``[0, d)``, the ``hi`` tables
    ``[d, 2d)``; each is ``(rows, d)`` with a contiguous last dim. Token ``n``
    reads row ``n`` of both (the halves of ``(N, 2d)`` tables) or, on a RoPE
    grid, row ``n // W`` of the lo (row angles) and ``n % W`` of the hi
    (column angles) tables: ``(H + W) d`` values instead of ``N 2d``.
    """
    if ROPE_GRID:
        lo_rows = offs_n // rope_width
        hi_rows = offs_n % rope_width
    else:
        lo_rows = offs_n
        hi_rows = offs_n
    sin_pe, sin_po = _load_pair(sin_lo_ptr, lo_rows, offs_i, mask_n, mask_i, stride_lo, 1)
    sin_ne, sin_no = _load_pair(sin_hi_ptr, hi_rows, offs_i, mask_n, mask_i, stride_hi, 1)
    cos_pe, cos_po = _load_pair(cos_lo_ptr, lo_rows, offs_i, mask_n, mask_i, stride_lo, 1)
    cos_ne, cos_no = _load_pair(cos_hi_ptr, hi_rows, offs_i, mask_n, mask_i, stride_hi, 1)
    return (sin_pe, sin_po, sin_ne, sin_no), (cos_pe, cos_po, cos_ne, cos_no)


@triton.jit
def _load_rope_or_placeholder(sin_lo_ptr, cos_lo_ptr, sin_hi_ptr, cos_hi_ptr, rope_width, stride_lo,
                              stride_hi, offs_n, offs_i, mask_n, mask_i, like, HAS_ROPE: tl.constexpr,
                              ROPE_GRID: tl.constexpr):
    """:func:`_load_rope` with ``HAS_ROPE``; without it quads of ``like`` (a tile) that nothing reads."""
    rope = ((like, like, like, like), (like, like, like, like))
    if HAS_ROPE:
        rope = _load_rope(sin_lo_ptr, cos_lo_ptr, sin_hi_ptr, cos_hi_ptr, rope_width, stride_lo,
                          stride_hi, offs_n, offs_i, mask_n, mask_i, ROPE_GRID)
    return rope


@triton.jit
def _load_temps(temp_ptr, stream, head, num_heads, offs_i, mask_i, HEAD_DIM: tl.constexpr):
    """Temperature quad of one stream and head from the fp32 ``(2, h, 2d)`` stack."""
    base = temp_ptr + (stream * num_heads + head) * (2 * HEAD_DIM)
    pe = tl.load(base + 2 * offs_i, mask=mask_i, other=0.0)
    po = tl.load(base + 2 * offs_i + 1, mask=mask_i, other=0.0)
    ne = tl.load(base + HEAD_DIM + 2 * offs_i, mask=mask_i, other=0.0)
    no = tl.load(base + HEAD_DIM + 2 * offs_i + 1, mask=mask_i, other=0.0)
    return pe, po, ne, no


@triton.jit
def _load_vec_quad(base, offs_i, BLOCK_D: tl.constexpr):
    """Four ``(BLOCK_D,)`` vectors stored back to back (zero-padded, no mask needed)."""
    return (tl.load(base + offs_i), tl.load(base + BLOCK_D + offs_i),
            tl.load(base + 2 * BLOCK_D + offs_i), tl.load(base + 3 * BLOCK_D + offs_i))


@triton.jit
def _load_scale_quad(scale_ptr, bh, slot: tl.constexpr, offs_i, BLOCK_D: tl.constexpr, SHIFTED: tl.constexpr):
    """Quad ``slot`` (:data:`SCALE_SLOTS`) of the scale tensor with ``SHIFTED``; zeros (unused) without."""
    quad = _zeros_vec_quad(BLOCK_D)
    if SHIFTED:
        quad = _load_vec_quad(scale_ptr + (bh * 4 + slot) * 4 * BLOCK_D, offs_i, BLOCK_D)
    return quad


@triton.jit
def _store_vec_quad(base, v, offs_i, BLOCK_D: tl.constexpr):
    for j in tl.static_range(4):
        tl.store(base + j * BLOCK_D + offs_i, v[j])


@triton.jit
def _load_mat_quad(base, offs_i, BLOCK_D: tl.constexpr):
    """Four ``(BLOCK_D, BLOCK_D)`` row-major blocks stored back to back."""
    ptrs = base + offs_i[:, None] * BLOCK_D + offs_i[None, :]
    size = BLOCK_D * BLOCK_D
    return (tl.load(ptrs), tl.load(ptrs + size), tl.load(ptrs + 2 * size), tl.load(ptrs + 3 * size))


@triton.jit
def _store_mat_quad(base, mats, offs_i, BLOCK_D: tl.constexpr):
    ptrs = base + offs_i[:, None] * BLOCK_D + offs_i[None, :]
    for j in tl.static_range(4):
        tl.store(ptrs + j * BLOCK_D * BLOCK_D, mats[j])


@triton.jit
def _zeros_vec_quad(BLOCK_D: tl.constexpr):
    z = tl.zeros((BLOCK_D,), tl.float32)
    return z, z, z, z


@triton.jit
def _zeros_mat_quad(BLOCK_D: tl.constexpr):
    z = tl.zeros((BLOCK_D, BLOCK_D), tl.float32)
    return z, z, z, z


@triton.jit
def _dot_quads(a, b, acc, PRECISION: tl.constexpr):
    """``acc + sum_j a[j] @ b[j]``: the product of two quad-split operands."""
    acc = tl.dot(a[0], b[0], acc, input_precision=PRECISION)
    acc = tl.dot(a[1], b[1], acc, input_precision=PRECISION)
    acc = tl.dot(a[2], b[2], acc, input_precision=PRECISION)
    return tl.dot(a[3], b[3], acc, input_precision=PRECISION)


# ----------------------------------------------------------------------------
# Query stream: recompute phi_q, R(phi_q), the numerator and the denominator.
# ----------------------------------------------------------------------------


@triton.jit
def _stream_operands(q_even, q_odd, stream, head, bh, num_heads, temp_ptr, state_ptr, mean_ptr, scale_ptr, offs_i,
                     mask_i, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, SHIFTED: tl.constexpr):
    """What one stream reads for a query tile.

    Returns ``(x_even, x_odd)`` (the signed query: the opposite stream sees
    ``-q``), the stream's temperature quad, its state quad ``S_s``
    ``(BLOCK_D, BLOCK_D)`` x 4, the key mean quad ``m`` and (``SHIFTED``) the
    quads of ``L`` and ``log m`` (zeros, unused, without).
    """
    sign = 1.0 - 2.0 * stream
    temps = _load_temps(temp_ptr, stream, head, num_heads, offs_i, mask_i, HEAD_DIM)
    state = _load_mat_quad(state_ptr + (bh * 2 + stream) * 4 * BLOCK_D * BLOCK_D, offs_i, BLOCK_D)
    mean = _load_vec_quad(mean_ptr + bh * 4 * BLOCK_D, offs_i, BLOCK_D)
    scales = (_load_scale_quad(scale_ptr, bh, _LOG_SCALE, offs_i, BLOCK_D, SHIFTED),
              _load_scale_quad(scale_ptr, bh, _LOG_MEAN, offs_i, BLOCK_D, SHIFTED))
    return (q_even * sign, q_odd * sign), temps, state, mean, scales


@triton.jit
def _query_stream(x, temps, state, mean, scales, rope, mask_n, eps, HAS_ROPE: tl.constexpr,
                  SHIFTED: tl.constexpr, PRECISION: tl.constexpr):
    """One stream over a ``(BLOCK_N, d)`` query tile (operands from :func:`_stream_operands`).

    Returns the feature quad ``phi_q``, its rotation ``R(phi_q)``, the numerator
    ``R(phi_q) S_s`` ``(BLOCK_N, BLOCK_D)``, the denominator
    ``phi_q . m + eps`` ``(BLOCK_N,)`` (1 on rows past ``N``; with ``SHIFTED``
    ``eps exp(-c)``, at least the smallest normal fp32 number when ``eps > 0``,
    as :func:`~.common.shifted_eps`) and the features' ``exp(offset)`` tiles
    (even, odd inputs) for the backward.
    """
    feats, feat_scales, eps_factor = _query_features(x[0], x[1], temps, scales, SHIFTED)
    eps_term = eps * eps_factor
    if SHIFTED:
        eps_term = tl.where(eps > 0, tl.maximum(eps_term, _FP32_TINY), eps_term)
    den = tl.where(mask_n, _row_dot(feats, mean) + eps_term, 1.0)
    rotated = feats
    if HAS_ROPE:
        rotated = _rotate_quads(feats, rope, False)
    num = _dot_quads(rotated, state, tl.zeros_like(feats[0]), PRECISION)
    return feats, rotated, num, den, feat_scales


# ----------------------------------------------------------------------------
# Forward kernels.
# ----------------------------------------------------------------------------


@_autotune
@triton.jit(do_not_specialize=_SIZE_ARGS)
def fwd_state_kernel(k_ptr, v_ptr, sin_lo_ptr, cos_lo_ptr, sin_hi_ptr, cos_hi_ptr,
                     rope_width, rope_stride_lo, rope_stride_hi, scale_ptr, state_part_ptr, mean_part_ptr,
                     seq_len, num_heads, chunk_len,
                     stride_kb, stride_kh, stride_kn, stride_kd,
                     stride_vb, stride_vh, stride_vn, stride_vd,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HAS_ROPE: tl.constexpr,
                     ROPE_GRID: tl.constexpr, SHIFTED: tl.constexpr, PRECISION: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    """Phase 1: chunk partial sums of ``R(phi_k)^T v_s`` and ``phi_k`` (shifted by ``b`` with ``SHIFTED``).

    Grid ``(num_chunks * 2, B * h)``. Writes ``state_part[bh, chunk, stream]``
    ``(4, BLOCK_D, BLOCK_D)`` and (stream 0) ``mean_part[bh, chunk]`` ``(4, BLOCK_D)``.
    """
    stream = tl.program_id(0) % 2
    chunk = tl.program_id(0) // 2
    num_chunks = tl.num_programs(0) // 2
    bh = tl.program_id(1).to(tl.int64)  # int64: bh * stride must not overflow
    batch, head = _batch_and_head(bh, num_heads)
    k_base = k_ptr + batch * stride_kb + head * stride_kh
    v_base = v_ptr + batch * stride_vb + head * stride_vh + stream * (HEAD_DIM // 2) * stride_vd
    offs_i = tl.arange(0, BLOCK_D)
    mask_i = offs_i < HEAD_DIM // 2

    shifts = _load_scale_quad(scale_ptr, bh, _KEY_SHIFT, offs_i, BLOCK_D, SHIFTED)

    acc = _zeros_mat_quad(BLOCK_D)
    key_sum = _zeros_vec_quad(BLOCK_D)
    start = chunk * chunk_len
    stop = tl.minimum(start + chunk_len, seq_len)
    for n0 in range(start, stop, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < stop
        k_even, k_odd = _load_pair(k_base, offs_n, offs_i, mask_n, mask_i, stride_kn, stride_kd)
        feats, _ = _key_features(k_even, k_odd, shifts, SHIFTED)
        key_sum = (key_sum[0] + tl.sum(feats[0], axis=0), key_sum[1] + tl.sum(feats[1], axis=0),
                   key_sum[2] + tl.sum(feats[2], axis=0), key_sum[3] + tl.sum(feats[3], axis=0))
        if HAS_ROPE:
            rope = _load_rope(sin_lo_ptr, cos_lo_ptr, sin_hi_ptr, cos_hi_ptr, rope_width, rope_stride_lo,
                              rope_stride_hi, offs_n, offs_i, mask_n, mask_i, ROPE_GRID)
            feats = _rotate_quads(feats, rope, False)
        v_tile = _load_cols(v_base, offs_n, offs_i, mask_n, mask_i, stride_vn, stride_vd)
        acc = (tl.dot(tl.trans(feats[0]), v_tile, acc[0], input_precision=PRECISION),
               tl.dot(tl.trans(feats[1]), v_tile, acc[1], input_precision=PRECISION),
               tl.dot(tl.trans(feats[2]), v_tile, acc[2], input_precision=PRECISION),
               tl.dot(tl.trans(feats[3]), v_tile, acc[3], input_precision=PRECISION))

    part = (bh * num_chunks + chunk) * 2 + stream
    _store_mat_quad(state_part_ptr + part * 4 * BLOCK_D * BLOCK_D, acc, offs_i, BLOCK_D)
    if stream == 0:
        _store_vec_quad(mean_part_ptr + (bh * num_chunks + chunk) * 4 * BLOCK_D, key_sum, offs_i, BLOCK_D)


@_autotune
@triton.jit(do_not_specialize=_SIZE_ARGS[:-1])
def fwd_out_kernel(q_ptr, temp_ptr, sin_lo_ptr, cos_lo_ptr, sin_hi_ptr, cos_hi_ptr,
                   rope_width, rope_stride_lo, rope_stride_hi, state_ptr, mean_ptr, scale_ptr, o_ptr,
                   seq_len, num_heads, eps,
                   stride_qb, stride_qh, stride_qn, stride_qd,
                   stride_ob, stride_oh, stride_on, stride_od,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HAS_ROPE: tl.constexpr,
                   ROPE_GRID: tl.constexpr, SHIFTED: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    """Phase 2: ``o_s = R(phi_q) S_s / (phi_q . m + eps)`` for one token tile and stream.

    Grid ``(num_tiles * 2, B * h)``; writes channels ``[s d/2, (s+1) d/2)`` of ``o``.
    """
    stream = tl.program_id(0) % 2
    tile = tl.program_id(0) // 2
    bh = tl.program_id(1).to(tl.int64)  # int64: bh * stride must not overflow
    batch, head = _batch_and_head(bh, num_heads)
    offs_i = tl.arange(0, BLOCK_D)
    mask_i = offs_i < HEAD_DIM // 2
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < seq_len

    q_even, q_odd = _load_pair(q_ptr + batch * stride_qb + head * stride_qh, offs_n, offs_i,
                               mask_n, mask_i, stride_qn, stride_qd)
    rope = _load_rope_or_placeholder(sin_lo_ptr, cos_lo_ptr, sin_hi_ptr, cos_hi_ptr, rope_width, rope_stride_lo,
                                     rope_stride_hi, offs_n, offs_i, mask_n, mask_i, q_even, HAS_ROPE, ROPE_GRID)
    x, temps, state, mean, scales = _stream_operands(q_even, q_odd, stream, head, bh, num_heads, temp_ptr,
                                                     state_ptr, mean_ptr, scale_ptr, offs_i, mask_i, HEAD_DIM,
                                                     BLOCK_D, SHIFTED)
    _, _, num, den, _ = _query_stream(x, temps, state, mean, scales, rope, mask_n, eps, HAS_ROPE, SHIFTED,
                                      PRECISION)
    o_base = o_ptr + batch * stride_ob + head * stride_oh + stream * (HEAD_DIM // 2) * stride_od
    _store_cols(o_base, num / den[:, None], offs_n, offs_i, mask_n, mask_i, stride_on, stride_od)


# ----------------------------------------------------------------------------
# Backward kernels.
# ----------------------------------------------------------------------------


@_autotune
@triton.jit(do_not_specialize=_SIZE_ARGS)
def bwd_state_kernel(q_ptr, do_ptr, temp_ptr, sin_lo_ptr, cos_lo_ptr, sin_hi_ptr, cos_hi_ptr,
                     rope_width, rope_stride_lo, rope_stride_hi, state_ptr, mean_ptr, scale_ptr,
                     dstate_part_ptr, dmean_part_ptr,
                     seq_len, num_heads, chunk_len, eps,
                     stride_qb, stride_qh, stride_qn, stride_qd,
                     stride_gb, stride_gh, stride_gn, stride_gd,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HAS_ROPE: tl.constexpr,
                     ROPE_GRID: tl.constexpr, SHIFTED: tl.constexpr, PRECISION: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    """Chunk partial sums of ``dS_s = R(phi_q)^T dnum`` and ``dm_s = phi_q^T dden``.

    Grid ``(num_chunks * 2, B * h)``. Writes ``dstate_part[bh, chunk, stream]``
    ``(4, BLOCK_D, BLOCK_D)`` and ``dmean_part[bh, chunk, stream]`` ``(4, BLOCK_D)``.
    """
    stream = tl.program_id(0) % 2
    chunk = tl.program_id(0) // 2
    num_chunks = tl.num_programs(0) // 2
    bh = tl.program_id(1).to(tl.int64)  # int64: bh * stride must not overflow
    batch, head = _batch_and_head(bh, num_heads)
    q_base = q_ptr + batch * stride_qb + head * stride_qh
    do_base = do_ptr + batch * stride_gb + head * stride_gh + stream * (HEAD_DIM // 2) * stride_gd
    offs_i = tl.arange(0, BLOCK_D)
    mask_i = offs_i < HEAD_DIM // 2

    dstate = _zeros_mat_quad(BLOCK_D)
    dmean = _zeros_vec_quad(BLOCK_D)
    start = chunk * chunk_len
    stop = tl.minimum(start + chunk_len, seq_len)
    for n0 in range(start, stop, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < stop
        q_even, q_odd = _load_pair(q_base, offs_n, offs_i, mask_n, mask_i, stride_qn, stride_qd)
        rope = _load_rope_or_placeholder(sin_lo_ptr, cos_lo_ptr, sin_hi_ptr, cos_hi_ptr, rope_width,
                                         rope_stride_lo, rope_stride_hi, offs_n, offs_i, mask_n, mask_i, q_even,
                                         HAS_ROPE, ROPE_GRID)
        x, temps, state, mean, scales = _stream_operands(q_even, q_odd, stream, head, bh, num_heads, temp_ptr,
                                                         state_ptr, mean_ptr, scale_ptr, offs_i, mask_i, HEAD_DIM,
                                                         BLOCK_D, SHIFTED)
        feats, rotated, num, den, _ = _query_stream(x, temps, state, mean, scales, rope, mask_n, eps, HAS_ROPE,
                                                    SHIFTED, PRECISION)
        grad = _load_cols(do_base, offs_n, offs_i, mask_n, mask_i, stride_gn, stride_gd)
        dnum = grad / den[:, None]
        dden = -tl.sum(dnum * num, axis=1) / den
        dstate = (tl.dot(tl.trans(rotated[0]), dnum, dstate[0], input_precision=PRECISION),
                  tl.dot(tl.trans(rotated[1]), dnum, dstate[1], input_precision=PRECISION),
                  tl.dot(tl.trans(rotated[2]), dnum, dstate[2], input_precision=PRECISION),
                  tl.dot(tl.trans(rotated[3]), dnum, dstate[3], input_precision=PRECISION))
        dmean = (dmean[0] + tl.sum(feats[0] * dden[:, None], axis=0),
                 dmean[1] + tl.sum(feats[1] * dden[:, None], axis=0),
                 dmean[2] + tl.sum(feats[2] * dden[:, None], axis=0),
                 dmean[3] + tl.sum(feats[3] * dden[:, None], axis=0))

    part = (bh * num_chunks + chunk) * 2 + stream
    _store_mat_quad(dstate_part_ptr + part * 4 * BLOCK_D * BLOCK_D, dstate, offs_i, BLOCK_D)
    _store_vec_quad(dmean_part_ptr + part * 4 * BLOCK_D, dmean, offs_i, BLOCK_D)


@triton.jit
def _query_stream_grad(q_even, q_odd, grad, stream, head, bh, num_heads, eps, temp_ptr, state_ptr,
                       mean_ptr, scale_ptr, rope, offs_i, mask_i, mask_n, HEAD_DIM: tl.constexpr,
                       BLOCK_D: tl.constexpr, HAS_ROPE: tl.constexpr, SHIFTED: tl.constexpr,
                       PRECISION: tl.constexpr):
    """One stream's contribution to ``dq`` (even, odd tiles) and its temperature-gradient quad."""
    x, temps, state, mean, scales = _stream_operands(q_even, q_odd, stream, head, bh, num_heads, temp_ptr,
                                                     state_ptr, mean_ptr, scale_ptr, offs_i, mask_i, HEAD_DIM,
                                                     BLOCK_D, SHIFTED)
    feats, _, num, den, feat_scales = _query_stream(x, temps, state, mean, scales, rope, mask_n, eps, HAS_ROPE,
                                                    SHIFTED, PRECISION)
    dnum = grad / den[:, None]
    dden = -tl.sum(dnum * num, axis=1) / den
    # dR(phi_q) = dnum S_s^T, quad by quad.
    g = (tl.dot(dnum, tl.trans(state[0]), input_precision=PRECISION),
         tl.dot(dnum, tl.trans(state[1]), input_precision=PRECISION),
         tl.dot(dnum, tl.trans(state[2]), input_precision=PRECISION),
         tl.dot(dnum, tl.trans(state[3]), input_precision=PRECISION))
    if HAS_ROPE:
        g = _rotate_quads(g, rope, True)
    g = (g[0] + dden[:, None] * mean[0][None, :], g[1] + dden[:, None] * mean[1][None, :],
         g[2] + dden[:, None] * mean[2][None, :], g[3] + dden[:, None] * mean[3][None, :])
    dx_even, dt_pe, dt_ne = _polar_features_backward(x[0], feats[0], feats[2], g[0], g[2],
                                                     temps[0][None, :], temps[2][None, :], feat_scales[0])
    dx_odd, dt_po, dt_no = _polar_features_backward(x[1], feats[1], feats[3], g[1], g[3],
                                                    temps[1][None, :], temps[3][None, :], feat_scales[1])
    sign = 1.0 - 2.0 * stream
    return dx_even * sign, dx_odd * sign, (dt_pe, dt_po, dt_ne, dt_no)


@_autotune
@triton.jit(do_not_specialize=_SIZE_ARGS)
def bwd_query_kernel(q_ptr, do_ptr, temp_ptr, sin_lo_ptr, cos_lo_ptr, sin_hi_ptr, cos_hi_ptr,
                     rope_width, rope_stride_lo, rope_stride_hi, state_ptr, mean_ptr, scale_ptr,
                     dq_ptr, dtemp_part_ptr,
                     seq_len, num_heads, chunk_len, eps,
                     stride_qb, stride_qh, stride_qn, stride_qd,
                     stride_gb, stride_gh, stride_gn, stride_gd,
                     stride_dqb, stride_dqh, stride_dqn, stride_dqd,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HAS_ROPE: tl.constexpr,
                     ROPE_GRID: tl.constexpr, SHIFTED: tl.constexpr, PRECISION: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    """``dq`` (both streams) and chunk partial sums of the temperature gradients.

    Grid ``(num_chunks, B * h)``. Writes ``dq`` and ``dtemp_part[bh, chunk, stream]`` ``(4, BLOCK_D)``.
    """
    chunk = tl.program_id(0)
    num_chunks = tl.num_programs(0)
    bh = tl.program_id(1).to(tl.int64)  # int64: bh * stride must not overflow
    batch, head = _batch_and_head(bh, num_heads)
    q_base = q_ptr + batch * stride_qb + head * stride_qh
    do_base = do_ptr + batch * stride_gb + head * stride_gh
    dq_base = dq_ptr + batch * stride_dqb + head * stride_dqh
    offs_i = tl.arange(0, BLOCK_D)
    mask_i = offs_i < HEAD_DIM // 2
    half = HEAD_DIM // 2

    dtemp_same = _zeros_vec_quad(BLOCK_D)
    dtemp_opp = _zeros_vec_quad(BLOCK_D)
    start = chunk * chunk_len
    stop = tl.minimum(start + chunk_len, seq_len)
    for n0 in range(start, stop, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < stop
        q_even, q_odd = _load_pair(q_base, offs_n, offs_i, mask_n, mask_i, stride_qn, stride_qd)
        rope = _load_rope_or_placeholder(sin_lo_ptr, cos_lo_ptr, sin_hi_ptr, cos_hi_ptr, rope_width,
                                         rope_stride_lo, rope_stride_hi, offs_n, offs_i, mask_n, mask_i, q_even,
                                         HAS_ROPE, ROPE_GRID)
        grad_same = _load_cols(do_base, offs_n, offs_i, mask_n, mask_i, stride_gn, stride_gd)
        grad_opp = _load_cols(do_base + half * stride_gd, offs_n, offs_i, mask_n, mask_i,
                              stride_gn, stride_gd)
        dq_even, dq_odd, dt = _query_stream_grad(
            q_even, q_odd, grad_same, 0, head, bh, num_heads, eps, temp_ptr, state_ptr, mean_ptr, scale_ptr,
            rope, offs_i, mask_i, mask_n, HEAD_DIM, BLOCK_D, HAS_ROPE, SHIFTED, PRECISION)
        dtemp_same = (dtemp_same[0] + dt[0], dtemp_same[1] + dt[1],
                      dtemp_same[2] + dt[2], dtemp_same[3] + dt[3])
        dq_even_o, dq_odd_o, dt = _query_stream_grad(
            q_even, q_odd, grad_opp, 1, head, bh, num_heads, eps, temp_ptr, state_ptr, mean_ptr, scale_ptr,
            rope, offs_i, mask_i, mask_n, HEAD_DIM, BLOCK_D, HAS_ROPE, SHIFTED, PRECISION)
        dtemp_opp = (dtemp_opp[0] + dt[0], dtemp_opp[1] + dt[1],
                     dtemp_opp[2] + dt[2], dtemp_opp[3] + dt[3])
        _store_pair(dq_base, dq_even + dq_even_o, dq_odd + dq_odd_o, offs_n, offs_i, mask_n, mask_i,
                    stride_dqn, stride_dqd)

    part = (bh * num_chunks + chunk) * 2
    _store_vec_quad(dtemp_part_ptr + part * 4 * BLOCK_D, dtemp_same, offs_i, BLOCK_D)
    _store_vec_quad(dtemp_part_ptr + (part + 1) * 4 * BLOCK_D, dtemp_opp, offs_i, BLOCK_D)


@_autotune
@triton.jit(do_not_specialize=_SIZE_ARGS[:-1])
def bwd_key_value_kernel(k_ptr, v_ptr, sin_lo_ptr, cos_lo_ptr, sin_hi_ptr, cos_hi_ptr,
                         rope_width, rope_stride_lo, rope_stride_hi, scale_ptr, dstate_ptr, dmean_ptr, dk_ptr,
                         dv_ptr, seq_len, num_heads,
                         stride_kb, stride_kh, stride_kn, stride_kd,
                         stride_vb, stride_vh, stride_vn, stride_vd,
                         stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                         stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                         HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HAS_ROPE: tl.constexpr,
                         ROPE_GRID: tl.constexpr, SHIFTED: tl.constexpr, PRECISION: tl.constexpr,
                         BLOCK_N: tl.constexpr):
    """``dk`` and ``dv`` for one token tile.

    ``dstate`` holds ``dS_s / N`` ``(B h, 2, 4, BLOCK_D, BLOCK_D)``, ``dmean`` holds
    ``dm / N`` ``(B h, 4, BLOCK_D)`` (with ``SHIFTED`` the gradients of the
    shifted sums, already divided by the key divisors ``r``). Grid ``(num_tiles, B * h)``.
    """
    tile = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)  # int64: bh * stride must not overflow
    batch, head = _batch_and_head(bh, num_heads)
    offs_i = tl.arange(0, BLOCK_D)
    mask_i = offs_i < HEAD_DIM // 2
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < seq_len
    half = HEAD_DIM // 2
    v_base = v_ptr + batch * stride_vb + head * stride_vh
    dv_base = dv_ptr + batch * stride_dvb + head * stride_dvh

    k_even, k_odd = _load_pair(k_ptr + batch * stride_kb + head * stride_kh, offs_n, offs_i,
                               mask_n, mask_i, stride_kn, stride_kd)
    shifts = _load_scale_quad(scale_ptr, bh, _KEY_SHIFT, offs_i, BLOCK_D, SHIFTED)
    feats, feat_scales = _key_features(k_even, k_odd, shifts, SHIFTED)
    rope = _load_rope_or_placeholder(sin_lo_ptr, cos_lo_ptr, sin_hi_ptr, cos_hi_ptr, rope_width, rope_stride_lo,
                                     rope_stride_hi, offs_n, offs_i, mask_n, mask_i, k_even, HAS_ROPE, ROPE_GRID)
    rotated = feats
    if HAS_ROPE:
        rotated = _rotate_quads(feats, rope, False)

    # dR(phi_k) = sum_s v_s dS_s^T / N;  dv_s = R(phi_k) dS_s / N.
    zero = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    g = (zero, zero, zero, zero)
    for stream in tl.static_range(2):
        dstate = _load_mat_quad(dstate_ptr + (bh * 2 + stream) * 4 * BLOCK_D * BLOCK_D, offs_i, BLOCK_D)
        v_tile = _load_cols(v_base + stream * half * stride_vd, offs_n, offs_i, mask_n, mask_i,
                            stride_vn, stride_vd)
        g = (tl.dot(v_tile, tl.trans(dstate[0]), g[0], input_precision=PRECISION),
             tl.dot(v_tile, tl.trans(dstate[1]), g[1], input_precision=PRECISION),
             tl.dot(v_tile, tl.trans(dstate[2]), g[2], input_precision=PRECISION),
             tl.dot(v_tile, tl.trans(dstate[3]), g[3], input_precision=PRECISION))
        dv = _dot_quads(rotated, dstate, zero, PRECISION)
        _store_cols(dv_base + stream * half * stride_dvd, dv, offs_n, offs_i, mask_n, mask_i,
                    stride_dvn, stride_dvd)
    if HAS_ROPE:
        g = _rotate_quads(g, rope, True)
    dmean = _load_vec_quad(dmean_ptr + bh * 4 * BLOCK_D, offs_i, BLOCK_D)
    g = (g[0] + dmean[0][None, :], g[1] + dmean[1][None, :],
         g[2] + dmean[2][None, :], g[3] + dmean[3][None, :])
    dk_even, _, _ = _polar_features_backward(k_even, feats[0], feats[2], g[0], g[2], 1.0, 1.0, feat_scales[0])
    dk_odd, _, _ = _polar_features_backward(k_odd, feats[1], feats[3], g[1], g[3], 1.0, 1.0, feat_scales[1])
    _store_pair(dk_ptr + batch * stride_dkb + head * stride_dkh, dk_even, dk_odd, offs_n, offs_i,
                mask_n, mask_i, stride_dkn, stride_dkd)


#: every kernel by name (what an ahead-of-time build compiles)
KERNELS = dict(fwd_state_kernel=fwd_state_kernel, fwd_out_kernel=fwd_out_kernel, bwd_state_kernel=bwd_state_kernel,
               bwd_query_kernel=bwd_query_kernel, bwd_key_value_kernel=bwd_key_value_kernel)
#: pointer arguments that carry the caller's dtype; every other pointer is an fp32 workspace
IO_POINTERS = ('q_ptr', 'k_ptr', 'v_ptr', 'o_ptr', 'do_ptr', 'dq_ptr', 'dk_ptr', 'dv_ptr')
