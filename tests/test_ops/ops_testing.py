"""Helpers shared by the tests of the attention op (imported as a module: tests/test_ops is on sys.path)."""
import math

import torch

from polaformerpp.ops.pola_attention import naive_pola_attention_quadratic


def grid_for(n):
    """An (H, W) grid with H * W == n, as square as possible."""
    h = int(math.isqrt(n))
    while n % h:
        h -= 1
    return h, n // h


def make_inputs(B, h, N, d, dtype=torch.float32, seed=0, scale=1.0, requires_grad=False):
    """Random ``q, k, v`` ``(B, h, N, d)`` and temperatures ``(h, 2d)`` in (0.05, 0.95), all in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, N, d, generator=g) * scale for _ in range(3))
    ts = torch.rand(h, 2 * d, generator=g) * 0.9 + 0.05
    to = torch.rand(h, 2 * d, generator=g) * 0.9 + 0.05
    ts, to = ts.to(dtype), to.to(dtype)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if requires_grad:
        for t in (q, k, v, ts, to):
            t.requires_grad_(True)
    return q, k, v, ts, to

def float64_quadratic(q, k, v, ts, to, rope=None, eps=1e-6):
    """The quadratic reference (explicit N x N weights per stream) computed in float64."""
    rope = tuple(t.double() for t in rope) if isinstance(rope, tuple) else rope
    return naive_pola_attention_quadratic(*(t.double() for t in (q, k, v, ts, to)), rope=rope, eps=eps)


def assert_close_rel(actual, expected, rtol):
    """Max |difference| relative to the largest |expected| below ``rtol``."""
    err = ((actual.double() - expected.double()).abs().max() / expected.double().abs().max()).item()
    assert err < rtol, f'max error {err:.2e} relative to the largest output, allowed {rtol:.0e}'
