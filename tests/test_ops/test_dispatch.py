"""pola_attention: argument checks, backend choice and the value contracts."""
import pytest
import torch

from ops_testing import make_inputs
from polaformerpp.ops import RopeGrid, available_backends, pola_attention, pola_rope_tables


def _good():
    return make_inputs(1, 2, 6, 4)


@pytest.mark.parametrize('mutate, exc, words', [
    (lambda a: a.update(q=a['q'][0]), ValueError, 'q must have shape'),
    (lambda a: a.update(k=a['k'][:, :1]), ValueError, 'k must have the shape'),
    (lambda a: a.update(v=a['v'][:, :, :3]), ValueError, 'v must have shape'),
    (lambda a: a.update(q=a['q'][..., :3], k=a['k'][..., :3]), ValueError, 'must be even'),
    (lambda a: a.update(temp_same=a['temp_same'][:, :4]), ValueError, 'temp_same must have shape'),
    (lambda a: a.update(temp_opp=a['temp_opp'][None]), ValueError, 'temp_opp must have shape'),
    (lambda a: a.update(rope=pola_rope_tables(2, 2, 4)), ValueError, 'rope[0] (sin) must have shape'),
    (lambda a: a.update(rope=torch.zeros(6, 8)), TypeError, 'rope must be None, a RopeGrid(height, width) or'),
    (lambda a: a.update(rope=RopeGrid(2, 2)), ValueError, 'rope=RopeGrid(2, 2) covers 4 tokens, q has N=6'),
    (lambda a: a.update(rope=RopeGrid(2.0, 3)), ValueError, 'rope.height (RopeGrid) must be a positive int'),
    (lambda a: a.update(backend='cuda'), ValueError, 'backend must be one of'),
    (lambda a: a.update(q=a['q'].long()), TypeError, 'q must be a floating-point'),
    (lambda a: a.update(v=[1.0]), TypeError, 'v must be a torch.Tensor'),
    (lambda a: a.update(eps=-1.0), ValueError, 'eps must be'),
])
def test_bad_inputs_raise_clear_errors(mutate, exc, words):
    q, k, v, ts, to = _good()
    args = dict(q=q, k=k, v=v, temp_same=ts, temp_opp=to)
    mutate(args)
    with pytest.raises(exc) as info:
        pola_attention(**args)
    assert words in str(info.value)


def test_auto_backend_runs_on_cpu():
    q, k, v, ts, to = _good()
    out = pola_attention(q, k, v, ts, to, backend='auto')
    torch.testing.assert_close(out, pola_attention(q, k, v, ts, to, backend='torch'))


@pytest.mark.parametrize('backend', ['torch', 'cpu'])
def test_value_contract_errors(backend):
    """The CPU backends check the values their formulation relies on."""
    if backend not in available_backends():
        pytest.skip('fused CPU kernels not built')
    q, k, v, ts, to = _good()
    with pytest.raises(ValueError, match='temp_opp must be non-negative'):
        pola_attention(q, k, v, ts, -to, backend=backend)
    sin, cos = pola_rope_tables(2, 3, 4)
    cos = cos.clone()
    cos[:, 1] += 0.1
    with pytest.raises(ValueError, match='must give both channels of a rotation pair'):
        pola_attention(q, k, v, ts, to, rope=(sin, cos), backend=backend)


def test_gated_attention_under_autograd_is_the_plain_form():
    """With autograd recording ``pola_attention_gated`` is ``gated_output(pola_attention(...))``:
    same values and same gradients for every input, LePE and gate included."""
    from polaformerpp.ops import gated_output, pola_attention_gated
    B, h, N, d = 2, 2, 12, 4
    inputs = [t.double() for t in make_inputs(B, h, N, d)]
    g = torch.Generator().manual_seed(5)
    lepe, gate = (torch.randn(B, N, h * d, generator=g, dtype=torch.float64) for _ in range(2))
    leaves = [t.clone().requires_grad_(True) for t in (*inputs, lepe, gate)]
    out = pola_attention_gated(*leaves[:5], leaves[5], leaves[6], rope=RopeGrid(3, 4))
    plain = [t.clone().requires_grad_(True) for t in (*inputs, lepe, gate)]
    ref = gated_output(pola_attention(*plain[:5], rope=RopeGrid(3, 4), backend='torch'), plain[5], plain[6])
    torch.testing.assert_close(out, ref)
    weights = torch.randn(out.shape, generator=g, dtype=torch.float64)
    (out * weights).sum().backward()
    (ref * weights).sum().backward()
    for a, b in zip(leaves, plain):
        torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize('which', ['lepe', 'gate'])
def test_gated_attention_checks_its_epilogue(which):
    from polaformerpp.ops import pola_attention_gated
    q, k, v, ts, to = _good()  # B=1, h=2, N=6, d=4
    terms = dict(lepe=torch.zeros(1, 6, 8), gate=torch.zeros(1, 6, 8))
    terms[which] = torch.zeros(1, 8, 6)  # heads-major, not tokens
    with pytest.raises(ValueError) as info:
        pola_attention_gated(q, k, v, ts, to, **terms)
    assert f'{which} must have shape (B, N, h * dv) = (1, 6, 8), got (1, 8, 6)' in str(info.value)
