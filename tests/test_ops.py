"""pola_attention (torch backend) against a float64 quadratic reference written here."""
import math

import pytest
import torch

from polaformerpp.ops import RopeGrid, available_backends, pola_attention, pola_rope_factors, pola_rope_tables


def reference_pola_attention(q, k, v, ts, to, rope=None, eps=1e-6):
    """Quadratic float64 reference: explicit N x N weights per stream."""
    q, k, v, ts, to = (t.double() for t in (q, k, v, ts, to))
    n, d, dv = q.shape[-2], q.shape[-1], v.shape[-1]

    def rotate(x):
        if rope is None:
            return x
        sin, cos = (t.double() for t in rope)
        out = torch.empty_like(x)
        out[..., 0::2] = x[..., 0::2] * cos[:, 0::2] - x[..., 1::2] * sin[:, 0::2]
        out[..., 1::2] = x[..., 1::2] * cos[:, 1::2] + x[..., 0::2] * sin[:, 1::2]
        return out

    pos = lambda x: torch.clamp(x, min=0)  # noqa: E731
    phi_s = torch.exp(torch.cat([pos(q), pos(-q)], -1) * ts[None, :, None]) - 1
    phi_o = torch.exp(torch.cat([pos(-q), pos(q)], -1) * to[None, :, None]) - 1
    phi_k = torch.exp(torch.cat([pos(k), pos(-k)], -1)) - 1
    outs = []
    for phi_q, v_half in ((phi_s, v[..., :dv // 2]), (phi_o, v[..., dv // 2:])):
        weights = rotate(phi_q) @ rotate(phi_k).transpose(-1, -2) / n  # (B, h, N, N)
        den = (phi_q @ phi_k.transpose(-1, -2)).mean(-1, keepdim=True) + eps
        outs.append(weights @ v_half / den)
    return torch.cat(outs, -1)


def grid_for(n):
    """An (H, W) grid with H * W == n, as square as possible."""
    h = int(math.isqrt(n))
    while n % h:
        h -= 1
    return h, n // h


def make_inputs(B, h, N, d, dtype=torch.float32, seed=0, scale=1.0, requires_grad=False):
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


@pytest.mark.parametrize('d', [12, 32, 64, 96])
@pytest.mark.parametrize('N', [1, 7, 1000])
@pytest.mark.parametrize('use_rope', [False, True])
def test_matches_reference(d, N, use_rope):
    B, h = (2, 2) if N < 1000 else (1, 2)
    q, k, v, ts, to = make_inputs(B, h, N, d, dtype=torch.float64, seed=d + N)
    rope = pola_rope_tables(*grid_for(N), d, dtype=torch.float64) if use_rope else None
    out = pola_attention(q, k, v, ts, to, rope=rope, backend='torch')
    ref = reference_pola_attention(q, k, v, ts, to, rope)
    assert out.shape == (B, h, N, d) and out.dtype == torch.float64
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-10)


def test_fp32_matches_reference():
    q, k, v, ts, to = make_inputs(2, 3, 50, 16)
    rope = pola_rope_tables(5, 10, 16)
    out = pola_attention(q, k, v, ts, to, rope=rope)
    ref = reference_pola_attention(q, k, v, ts, to, rope)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)


def test_value_dim_may_differ():
    q, k, _, ts, to = make_inputs(1, 2, 9, 8, dtype=torch.float64)
    v = torch.randn(1, 2, 9, 6, dtype=torch.float64)
    out = pola_attention(q, k, v, ts, to)
    torch.testing.assert_close(out, reference_pola_attention(q, k, v, ts, to))


@pytest.mark.parametrize('use_rope', [False, True])
def test_gradcheck_including_temperatures(use_rope):
    q, k, v, ts, to = make_inputs(1, 2, 6, 4, dtype=torch.float64, seed=3, requires_grad=True)
    rope = pola_rope_tables(2, 3, 4, dtype=torch.float64) if use_rope else None
    assert torch.autograd.gradcheck(
        lambda *xs: pola_attention(*xs, rope=rope, backend='torch'), (q, k, v, ts, to))


def test_temperature_gradients_are_nonzero():
    q, k, v, ts, to = make_inputs(2, 2, 16, 8, requires_grad=True)
    pola_attention(q, k, v, ts, to).square().sum().backward()
    assert ts.grad.abs().sum() > 0 and to.grad.abs().sum() > 0


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_precision_matches_fp32(dtype):
    q, k, v, ts, to = make_inputs(2, 2, 196, 32, seed=7)
    rope = pola_rope_tables(14, 14, 32)
    ref = pola_attention(q, k, v, ts, to, rope=rope)
    out = pola_attention(q.to(dtype), k.to(dtype), v.to(dtype), ts.to(dtype), to.to(dtype),
                         rope=rope)
    assert out.dtype == dtype and torch.isfinite(out).all()
    # inputs themselves are rounded to half precision, hence the 1% budget
    rel = (out.float() - ref).norm() / ref.norm()
    assert rel < 1e-2, rel


def test_fp16_large_activations_do_not_overflow():
    # exp(12) > fp16 max: the feature maps must be computed in fp32
    q, k, v, ts, to = make_inputs(1, 1, 64, 8, scale=12.0, seed=1)
    ref = pola_attention(q, k, v, ts, to)
    out = pola_attention(q.half(), k.half(), v.half(), ts.half(), to.half())
    assert torch.isfinite(out).all()
    rel = (out.float() - ref).norm() / ref.norm()
    assert rel < 1e-2, rel


def test_fp16_long_sequence_is_finite():
    # 1/N = 5e-6 underflows to a subnormal in fp16; the state is kept in fp32
    N = 200_000
    q, k, v, ts, to = make_inputs(1, 1, N, 8, seed=2)
    out = pola_attention(q.half(), k.half(), v.half(), ts.half(), to.half())
    ref = pola_attention(q, k, v, ts, to)
    assert torch.isfinite(out).all()
    assert ((out.float() - ref).norm() / ref.norm()) < 1e-2


def test_rope_tables_layout():
    sin, cos = pola_rope_tables(3, 5, 8)
    assert sin.shape == cos.shape == (15, 16)
    freqs = 1.0 / 10000 ** torch.linspace(0, 1, 4)
    row, col = 2, 3
    n = row * 5 + col
    expected = torch.cat([row * freqs.repeat_interleave(2), col * freqs.repeat_interleave(2)])
    torch.testing.assert_close(sin[n], expected.sin())
    torch.testing.assert_close(cos[n], expected.cos())


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


@pytest.mark.parametrize('use_rope', [False, True])
def test_token_chunking_does_not_change_the_result(use_rope):
    from polaformerpp.ops import pola_attention_torch
    q, k, v, ts, to = make_inputs(2, 2, 1000, 16, dtype=torch.float64, seed=5, requires_grad=True)
    rope = pola_rope_tables(25, 40, 16, dtype=torch.float64) if use_rope else None
    whole = pola_attention_torch(q, k, v, ts, to, rope, chunk_size=4096)
    chunked = pola_attention_torch(q, k, v, ts, to, rope, chunk_size=96)
    torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=1e-12)
    grads_whole = torch.autograd.grad(whole.sum(), (q, k, v, ts, to))
    grads_chunked = torch.autograd.grad(chunked.sum(), (q, k, v, ts, to))
    for a, b in zip(grads_chunked, grads_whole):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


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


@pytest.mark.parametrize('use_rope', [False, True])
def test_extreme_keys_and_queries_stay_finite(use_rope):
    """exp(-k) is taken as 1 / exp(k): large |k| must still give exact zeros and finite outputs."""
    q, k, v, ts, to = make_inputs(1, 2, 12, 8, seed=9)
    k = k * 30  # exp(k) spans ~1e-40 .. 1e40 in fp32 only where |k| < 88
    k[..., 0, :] = 85.0
    k[..., 1, :] = -85.0
    rope = pola_rope_tables(3, 4, 8) if use_rope else None
    out = pola_attention(q, k.clamp(-85, 85), v, ts, to, rope=rope)
    ref = reference_pola_attention(q, k.clamp(-85, 85), v, ts, to, rope)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)


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


def test_rope_grid_gradcheck():
    q, k, v, ts, to = make_inputs(1, 2, 6, 4, dtype=torch.float64, seed=3, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda *xs: pola_attention(*xs, rope=RopeGrid(2, 3), backend='torch'), (q, k, v, ts, to))
