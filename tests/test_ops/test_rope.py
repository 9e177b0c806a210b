"""RoPE tables, their separable form and the RopeGrid argument."""
import pytest
import torch

from ops_testing import make_inputs
from polaformerpp.ops import (
    RopeGrid,
    apply_rope,
    available_backends,
    pola_attention,
    pola_rope_factors,
    pola_rope_tables,
    rope_2d_tables,
)
from polaformerpp.ops.rope import _rotates_as_complex, apply_rope_2d


def test_rope_tables_layout():
    sin, cos = pola_rope_tables(3, 5, 8)
    assert sin.shape == cos.shape == (15, 16)
    freqs = 1.0 / 10000 ** torch.linspace(0, 1, 4)
    row, col = 2, 3
    n = row * 5 + col
    expected = torch.cat([row * freqs.repeat_interleave(2), col * freqs.repeat_interleave(2)])
    torch.testing.assert_close(sin[n], expected.sin())
    torch.testing.assert_close(cos[n], expected.cos())


def test_rope_factors_rebuild_the_tables():
    sin, cos = pola_rope_tables(5, 7, 12)
    row_sin, row_cos, col_sin, col_cos = pola_rope_factors(5, 7, 12)
    n = torch.arange(35)
    assert torch.equal(sin, torch.cat([row_sin[n // 7], col_sin[n % 7]], dim=1))
    assert torch.equal(cos, torch.cat([row_cos[n // 7], col_cos[n % 7]], dim=1))


@pytest.mark.parametrize('backend', ['torch', 'cpu'])
def test_rope_grid_equals_tables(backend):
    """RopeGrid(H, W) is the rotation of pola_rope_tables(H, W, d), over several token chunks."""
    if backend not in available_backends():
        pytest.skip('fused CPU kernels not built')
    q, k, v, ts, to = make_inputs(2, 2, 6 * 700, 16, seed=11)
    tables = pola_rope_tables(6, 700, 16)
    out = pola_attention(q, k, v, ts, to, rope=RopeGrid(6, 700), backend=backend)
    torch.testing.assert_close(out, pola_attention(q, k, v, ts, to, rope=tables, backend=backend),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize('offset', [4, 5])
def test_rope_2d_complex_form_equals_the_real_form(dtype, offset):
    """apply_rope_2d on head views of a projection (complex-aligned at even offsets, not at odd
    ones, a real dtype without complex counterpart) against apply_rope, values and gradients."""
    H, W, C, heads = 3, 5, 16, 2
    proj = torch.randn(2, H * W, 4 * C + 2, dtype=dtype, requires_grad=True)
    q = proj[..., offset:offset + C].unflatten(-1, (heads, -1)).transpose(1, 2)
    grad = torch.randn(2, heads, H * W, C // heads, dtype=dtype)
    out, = apply_rope_2d(H, W, q)
    assert _rotates_as_complex(q) == (dtype != torch.bfloat16 and offset % 2 == 0)
    expected = apply_rope(q, *rope_2d_tables(H, W, C // heads, dtype=dtype))
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out, expected, **tol)
    torch.testing.assert_close(torch.autograd.grad(out, proj, grad)[0],
                               torch.autograd.grad(expected, proj, grad)[0], **tol)
    traced = torch.jit.trace(lambda t: apply_rope_2d(H, W, t)[0], q.detach().contiguous())
    assert 'complex' not in str(traced.graph)
