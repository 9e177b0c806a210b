"""The readable reference: its linear and quadratic forms, weights and feature maps agree."""
import pytest
import torch

from ops_testing import make_inputs
from polaformerpp.ops import RopeGrid, pola_attention, pola_feature_maps, pola_rope_tables
from polaformerpp.ops.pola_attention import naive_pola_attention, naive_pola_attention_quadratic, pola_attention_weights


@pytest.mark.parametrize('rope', [None, 'tables', 'grid'])
@pytest.mark.parametrize('dv', [8, 6])
def test_linear_form_equals_quadratic_form_in_float64(rope, dv):
    q, k, _, ts, to = make_inputs(2, 3, 35, 8, dtype=torch.float64, seed=4)
    v = torch.randn(2, 3, 35, dv, dtype=torch.float64)
    rope = {None: None, 'tables': pola_rope_tables(5, 7, 8, dtype=torch.float64), 'grid': RopeGrid(5, 7)}[rope]
    linear = naive_pola_attention(q, k, v, ts, to, rope)
    quadratic = naive_pola_attention_quadratic(q, k, v, ts, to, rope)
    assert linear.dtype == quadratic.dtype == torch.float64 and linear.shape == (2, 3, 35, dv)
    torch.testing.assert_close(linear, quadratic, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16, torch.float32])
def test_linear_form_computes_half_precision_in_fp32(dtype):
    q, k, v, ts, to = make_inputs(1, 2, 20, 8, seed=5)
    expected = naive_pola_attention(q, k, v, ts, to)
    out = naive_pola_attention(q.to(dtype), k.to(dtype), v.to(dtype), ts, to)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize('use_rope', [False, True])
def test_weights_reproduce_the_op(use_rope):
    """W_same @ v[..., :dv/2] and W_opp @ v[..., dv/2:] are the op's output halves, row by row."""
    q, k, v, ts, to = make_inputs(1, 2, 24, 8, dtype=torch.float64, seed=6)
    rope = pola_rope_tables(4, 6, 8, dtype=torch.float64) if use_rope else None
    out = pola_attention(q, k, v, ts, to, rope=rope, backend='torch')
    w_same, w_opp = pola_attention_weights(q, k, ts, to, rope)
    assert w_same.shape == w_opp.shape == (1, 2, 24, 24)
    torch.testing.assert_close(torch.cat([w_same @ v[..., :4], w_opp @ v[..., 4:]], -1), out)
    rows = torch.tensor([3, 17])
    some_same, some_opp = pola_attention_weights(q, k, ts, to, rope, query_index=rows)
    torch.testing.assert_close(some_same, w_same[..., rows, :])
    torch.testing.assert_close(some_opp, w_opp[..., rows, :])


def test_feature_maps():
    q, k, _, ts, to = make_inputs(2, 2, 9, 4, dtype=torch.float64, seed=7)
    phi_s, phi_o, phi_k = pola_feature_maps(q, k, ts, to)
    assert phi_s.shape == phi_o.shape == phi_k.shape == (2, 2, 9, 8)
    pos, neg = q.clamp(min=0), (-q).clamp(min=0)
    torch.testing.assert_close(phi_s, torch.exp(torch.cat([pos, neg], -1) * ts[None, :, None]) - 1)
    torch.testing.assert_close(phi_o, torch.exp(torch.cat([neg, pos], -1) * to[None, :, None]) - 1)
    torch.testing.assert_close(phi_k, torch.exp(torch.cat([k.clamp(min=0), (-k).clamp(min=0)], -1)) - 1)
    assert (phi_s >= 0).all() and (phi_o >= 0).all() and (phi_k >= 0).all()
