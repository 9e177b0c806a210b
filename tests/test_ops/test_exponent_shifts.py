"""Overflow-free attention: the exponent shifts of the eager and fused CPU backends.

``exp(x) - 1`` overflows float32 at ``x ~ 88.7``; the backends factor the
exponents' maxima out where the inputs need it (see
``polaformerpp.ops.pola_attention.common``). These tests hold both backends
and the effective-weight reference to the unshifted formula evaluated in
float64, at magnitudes where that formula itself stays finite in float64.
Inputs are uniform in ``[-s, s]``: every entry reaches the scale ``s``.
"""
import importlib

import pytest
import torch

from ops_testing import assert_close_rel, grid_for
from polaformerpp.ops import RopeGrid, available_backends, pola_attention, pola_feature_maps, pola_rope_tables
from polaformerpp.ops.pola_attention import common, pola_attention_weights
from polaformerpp.ops.rope import apply_rope

BACKENDS = [pytest.param('torch'),
            pytest.param('cpu', marks=pytest.mark.skipif('cpu' not in available_backends(),
                                                         reason='the fused CPU kernels are not built'))]


def uniform_inputs(B, h, N, d, scale, dtype=torch.float32, seed=0):
    """``q, k`` uniform in ``[-scale, scale]``, ``v`` standard normal, temperatures in (0.05, 0.95)."""
    g = torch.Generator().manual_seed(seed)
    q, k = ((2 * torch.rand(B, h, N, d, generator=g) - 1) * scale for _ in range(2))
    v = torch.randn(B, h, N, d, generator=g)
    ts, to = (torch.rand(h, 2 * d, generator=g) * 0.9 + 0.05 for _ in range(2))
    return q.to(dtype), k.to(dtype), v.to(dtype), ts, to


def plain_float64(q, k, v, ts, to, grid=None, eps=1e-6):
    """The method's formula without any shift (``exp`` as it is), in float64."""
    q, k, v, ts, to = (t.double() for t in (q, k, v, ts, to))
    phi_s, phi_o, phi_k = pola_feature_maps(q, k, ts, to)
    key_mean = phi_k.mean(dim=-2, keepdim=True)
    rotate = (lambda x: x) if grid is None else (
        lambda x: apply_rope(x, *pola_rope_tables(*grid, q.shape[-1], dtype=torch.float64)))
    half = v.shape[-1] // 2
    outs = []
    for phi_q, values in ((phi_s, v[..., :half]), (phi_o, v[..., half:])):
        weights = rotate(phi_q) @ rotate(phi_k).transpose(-1, -2)
        den = (phi_q * key_mean).sum(-1, keepdim=True) + eps
        outs.append(weights @ values / (k.shape[-2] * den))
    out = torch.cat(outs, dim=-1)
    assert torch.isfinite(out).all(), 'the float64 reference overflowed: choose a smaller scale'
    return out


def rope_for(use_rope, num_tokens):
    return RopeGrid(*grid_for(num_tokens)) if use_rope else None


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('use_rope', [False, True])
@pytest.mark.parametrize('scale', [1.0, 30.0, 100.0])
def test_fp32_outputs_match_float64_at_any_magnitude(backend, use_rope, scale):
    q, k, v, ts, to = uniform_inputs(2, 2, 48, 16, scale, seed=int(scale))
    rope = rope_for(use_rope, 48)
    out = pola_attention(q, k, v, ts, to, rope, backend=backend)
    assert torch.isfinite(out).all()
    assert_close_rel(out, plain_float64(q, k, v, ts, to, rope), 1e-4)


def gradient_tolerance(scale):
    """fp32 rounding of an exponent of size ``s`` is ``~s * 6e-8`` relative in ``exp``; the query and
    temperature gradients, differences of such terms summed over the tokens, reach 1e-4 to 5e-4 of
    their largest value at ``s = 100`` depending on the order of summation."""
    return 1e-4 if scale <= 30 else 1e-3


@pytest.mark.parametrize('use_rope', [False, True])
@pytest.mark.parametrize('scale', [1.0, 30.0, 100.0])
def test_torch_gradients_match_float64_at_any_magnitude(use_rope, scale):
    """The eager backend's autograd (the fused CPU backend hands inputs that need shifts to it in training)."""
    q, k, v, ts, to = uniform_inputs(1, 2, 40, 8, scale, seed=3)
    rope = rope_for(use_rope, 40)
    grad_out = torch.randn(1, 2, 40, 8, generator=torch.Generator().manual_seed(9))
    leaves = [t.clone().requires_grad_() for t in (q, k, v, ts, to)]
    grads = torch.autograd.grad(pola_attention(*leaves, rope, backend='torch'), leaves, grad_out)
    leaves64 = [t.double().requires_grad_() for t in (q, k, v, ts, to)]
    expected = torch.autograd.grad(plain_float64(*leaves64, rope), leaves64, grad_out.double())
    for name, actual, reference in zip(('q', 'k', 'v', 'temp_same', 'temp_opp'), grads, expected):
        assert torch.isfinite(actual).all(), name
        assert_close_rel(actual, reference, gradient_tolerance(scale))


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
@pytest.mark.parametrize('use_rope, scale', [(False, 300.0), (True, 100.0)])
def test_half_precision_extremes(backend, dtype, use_rope, scale):
    """|x| = 300 is far past exp's fp32 range (and fp16's 11.1), and still inside float64's for the reference."""
    q, k, v, ts, to = uniform_inputs(1, 2, 40, 16, scale, dtype=dtype, seed=5)
    rope = rope_for(use_rope, 40)
    leaves = [t.clone().requires_grad_(backend == 'torch') for t in (q, k, v)]
    out = pola_attention(*leaves, ts, to, rope, backend=backend)
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert_close_rel(out, plain_float64(q, k, v, ts, to, rope), 1e-2)
    if backend == 'torch':
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
        grads = torch.autograd.grad(out, leaves, grad_out)
        leaves64 = [t.double().requires_grad_() for t in (q, k, v)]
        expected = torch.autograd.grad(plain_float64(*leaves64, ts, to, rope), leaves64, grad_out.double())
        for actual, reference in zip(grads, expected):
            assert torch.isfinite(actual).all()
            assert_close_rel(actual, reference, 1e-2)


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('scale', [1.0, 100.0])
def test_zero_queries_give_exactly_zero(backend, scale):
    q, k, v, ts, to = uniform_inputs(1, 2, 36, 8, scale, seed=7)
    q[0, 0, 4] = 0
    q[0, 1, :] = 0  # a head with no active query at all
    for rope in (None, RopeGrid(6, 6)):
        out = pola_attention(q, k, v, ts, to, rope, backend=backend)
        assert torch.isfinite(out).all()
        assert (out[0, 0, 4] == 0).all() and (out[0, 1] == 0).all()


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('eps', [1e-6, 1e-2, 10.0])
def test_eps_keeps_its_meaning_under_shifts(backend, eps):
    """Large keys (shifted) with small queries: ``eps`` weighs in the denominator as in the formula."""
    q, k, v, ts, to = uniform_inputs(1, 2, 36, 8, 1.0, seed=11)
    q, k = q * 0.05, k * 60
    out = pola_attention(q, k, v, ts, to, eps=eps, backend=backend)
    assert_close_rel(out, plain_float64(q, k, v, ts, to, eps=eps), 1e-4)


def test_shift_engages_only_outside_the_shift_free_range():
    q, k, v, ts, to = uniform_inputs(1, 2, 16, 8, 1.0)
    assert not common.needs_exponent_shift(q * 20, k * 20, ts, to)
    assert common.needs_exponent_shift(q, k * 25, ts, to)  # a key feature past exp(20)
    assert common.needs_exponent_shift(q * 40, k * 20, ts * 0 + 1, to)  # query + key exponent past 40
    assert not common.needs_exponent_shift(q * float('nan'), k, ts, to)  # NaN propagates unshifted


@pytest.mark.parametrize('backend', BACKENDS)
def test_shifted_path_equals_the_unshifted_one_in_the_normal_range(backend, monkeypatch):
    """Forcing the shifted arithmetic on ordinary inputs changes the output at rounding level only."""
    q, k, v, ts, to = uniform_inputs(2, 2, 48, 16, 4.0, seed=13)
    rope = RopeGrid(6, 8)
    plain = pola_attention(q, k, v, ts, to, rope, backend=backend)
    module = importlib.import_module('polaformerpp.ops.pola_attention.' + ('eager' if backend == 'torch' else 'cpu'))
    monkeypatch.setattr(module, 'needs_exponent_shift', lambda *args: True)
    shifted = pola_attention(q, k, v, ts, to, rope, backend=backend)
    assert_close_rel(shifted, plain, 2e-6)


@pytest.mark.parametrize('use_rope', [False, True])
@pytest.mark.parametrize('scale', [1.0, 30.0, 100.0])
def test_effective_weights_match_float64_at_any_magnitude(use_rope, scale):
    """The analysis tools' ``N x N`` weights: finite in fp32, equal to the unshifted float64 weights."""
    q, k, v, ts, to = uniform_inputs(1, 2, 30, 8, scale, seed=17)
    q[0, 0, 2] = 0
    rope = rope_for(use_rope, 30)
    weights = pola_attention_weights(q, k, ts, to, rope)
    weights64 = pola_attention_weights(q.double(), k.double(), ts.double(), to.double(), rope)
    out64 = plain_float64(q, k, v, ts, to, rope)
    for w, w64 in zip(weights, weights64):
        assert torch.isfinite(w).all()
        assert (w[0, 0, 2] == 0).all()
        assert_close_rel(w, w64, 1e-4)
    assert_close_rel(torch.cat([weights64[0] @ v.double()[..., :4], weights64[1] @ v.double()[..., 4:]], -1),
                     out64, 1e-10)


@pytest.mark.parametrize('backend', BACKENDS)
def test_heavy_tailed_inputs_without_rope(backend):
    """Normal q, k of std 100 (entries up to ~400): channels whose largest keys differ by hundreds
    of nats keep their own shifts and divisors, so outputs and gradients stay accurate."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 48, 16, generator=g) * 100 for _ in range(2))
    v = torch.randn(1, 2, 48, 16, generator=g)
    ts, to = (torch.rand(2, 32, generator=g) * 0.9 + 0.05 for _ in range(2))
    leaves = [t.clone().requires_grad_(backend == 'torch') for t in (q, k, v, ts, to)]
    out = pola_attention(*leaves, backend=backend)
    leaves64 = [t.double().requires_grad_() for t in (q, k, v, ts, to)]
    expected = plain_float64(*leaves64)
    assert_close_rel(out, expected, 1e-4)
    if backend == 'torch':
        grad_out = torch.randn(out.shape, generator=g)
        for actual, reference in zip(torch.autograd.grad(out, leaves, grad_out),
                                     torch.autograd.grad(expected, leaves64, grad_out.double())):
            assert_close_rel(actual, reference, 1e-4)
