"""RoPE tables, their separable form and the RopeGrid argument."""
import pytest
import torch

from ops_testing import make_inputs
from polaformerpp.ops import RopeGrid, available_backends, pola_attention, pola_rope_factors, pola_rope_tables


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
