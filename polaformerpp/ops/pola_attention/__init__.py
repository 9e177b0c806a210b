"""Polarity-aware linear attention with channel-wise spiky feature maps.

The method
----------
For one head with queries ``q``, keys ``k`` (``N x d``) and values ``v``
(``N x dv``), with ``x+ = relu(x)``, ``x- = relu(-x)`` and temperatures ``ts``,
``to`` in (0, 1) of ``2d`` channels (sigmoid outputs)::

    phi_s = exp([q+, q-] * ts) - 1        same-polarity queries   (N, 2d)
    phi_o = exp([q-, q+] * to) - 1        opposite-polarity queries
    phi_k = exp([k+, k-]) - 1             keys, shared by both streams

    S = R(phi_k)^T v / N                  (2d, dv): one state for both streams
    m = mean_N(phi_k)                     (2d,)
    out_same = R(phi_s) S[:, :dv/2] / (phi_s m + eps)
    out_opp  = R(phi_o) S[:, dv/2:] / (phi_o m + eps)
    out = [out_same | out_opp]            (N, dv)

``R`` is the optional 2-D rotary embedding (numerator only) of
:func:`~polaformerpp.ops.rope.pola_rope_tables`: channel pairs ``(2i, 2i+1)``
rotated by one angle, row angles on feature channels ``[0, d)`` and column
angles on ``[d, 2d)``. The cost is ``O(N d dv)``; no ``N x N`` matrix is ever
formed. The same output written through those ``N x N`` weights,
``W_s[i, j] = <R phi_s[i], R phi_k[j]> / (N (phi_s[i] m + eps))``, is the
quadratic form of :mod:`.naive`.

The output is unchanged when the key features are scaled per channel (pairs
alike) and each query's by a compensating factor, ``eps`` with it: every
backend uses this to factor the exponents' maxima out where the inputs need it,
so finite inputs give finite outputs and gradients (:mod:`.common`).

Modules
-------
* :mod:`.naive` - the readable reference (quadratic and linear form, feature
  maps, per-query weights), plain torch;
* :mod:`.eager` - the chunked PyTorch backend (``backend='torch'``);
* :mod:`.cpu` - the fused CPU forward (``backend='cpu'``, C++ in ``polaformerpp/ops/csrc/pola_attention/``);
* :mod:`.cpu_backward` - its analytic backward, for training on the CPU;
* :mod:`.custom_ops` - both as torch custom ops (fake kernels, autograd), what
  ``torch.compile`` and ``torch.export`` trace;
* :mod:`.triton_kernels` and :mod:`.triton_ops` - the fused Triton backend
  (``backend='triton'``), imported on first use;
* :mod:`.common` - what the backends share (chunking, signed temperatures,
  checks, the one RoPE form :class:`~polaformerpp.ops.rope.RopeHalves`);
* :mod:`.dispatch` - :func:`pola_attention`: argument checks, backend choice
  and the one conversion of the RoPE argument.
"""
from .common import as_rope_halves
from .cpu import cpu_kernels_apply, exponent_shift_needed, pola_attention_cpu_with_state
from .cpu_backward import pola_attention_cpu_backward
from .custom_ops import eager_decompositions
from .dispatch import available_backends, gated_output, pola_attention, pola_attention_gated
from .eager import pola_attention_torch
from .naive import naive_pola_attention, naive_pola_attention_quadratic, pola_attention_weights, pola_feature_maps

__all__ = [
    'pola_attention', 'pola_attention_gated', 'gated_output', 'pola_attention_torch', 'pola_feature_maps',
    'available_backends',
    'pola_attention_weights', 'naive_pola_attention', 'naive_pola_attention_quadratic',
    # the fused CPU backend's pieces, for the fused modules (polaformerpp.ops.fusion)
    'cpu_kernels_apply', 'exponent_shift_needed', 'pola_attention_cpu_with_state', 'pola_attention_cpu_backward',
    'as_rope_halves',
    # the custom ops' eager form, for exporters to formats without them (ONNX)
    'eager_decompositions'
]
