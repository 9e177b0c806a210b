"""The eager torch backend of pola_attention against the float64 quadratic reference."""
import importlib

import pytest
import torch

from ops_testing import float64_quadratic, grid_for, make_inputs
from polaformerpp.ops import RopeGrid, pola_attention, pola_rope_tables


@pytest.mark.parametrize('d', [12, 32, 64, 96])
@pytest.mark.parametrize('N', [1, 7, 1000])
@pytest.mark.parametrize('use_rope', [False, True])
def test_matches_reference(d, N, use_rope):
    B, h = (2, 2) if N < 1000 else (1, 2)
    q, k, v, ts, to = make_inputs(B, h, N, d, dtype=torch.float64, seed=d + N)
    rope = pola_rope_tables(*grid_for(N), d, dtype=torch.float64) if use_rope else None
    out = pola_attention(q, k, v, ts, to, rope=rope, backend='torch')
    ref = float64_quadratic(q, k, v, ts, to, rope)
    assert out.shape == (B, h, N, d) and out.dtype == torch.float64
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-10)


def test_fp32_matches_reference():
    q, k, v, ts, to = make_inputs(2, 3, 50, 16)
    rope = pola_rope_tables(5, 10, 16)
    out = pola_attention(q, k, v, ts, to, rope=rope)
    ref = float64_quadratic(q, k, v, ts, to, rope)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)


def test_value_dim_may_differ():
    q, k, _, ts, to = make_inputs(1, 2, 9, 8, dtype=torch.float64)
    v = torch.randn(1, 2, 9, 6, dtype=torch.float64)
    out = pola_attention(q, k, v, ts, to)
    torch.testing.assert_close(out, float64_quadratic(q, k, v, ts, to))


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


@pytest.mark.parametrize('use_rope', [False, True])
def test_extreme_keys_and_queries_stay_finite(use_rope):
    """exp(-k) is taken as 1 / exp(k): large |k| must still give exact zeros and finite outputs."""
    q, k, v, ts, to = make_inputs(1, 2, 12, 8, seed=9)
    k = k * 30  # exp(k) spans ~1e-40 .. 1e40 in fp32 only where |k| < 88
    k[..., 0, :] = 85.0
    k[..., 1, :] = -85.0
    rope = pola_rope_tables(3, 4, 8) if use_rope else None
    out = pola_attention(q, k.clamp(-85, 85), v, ts, to, rope=rope)
    ref = float64_quadratic(q, k.clamp(-85, 85), v, ts, to, rope)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)


def test_rope_grid_gradcheck():
    q, k, v, ts, to = make_inputs(1, 2, 6, 4, dtype=torch.float64, seed=3, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda *xs: pola_attention(*xs, rope=RopeGrid(2, 3), backend='torch'), (q, k, v, ts, to))



@pytest.mark.parametrize('rope_form', ['grid', 'tables'])
def test_traced_form_of_the_rotation_equals_the_eager_one(rope_form, monkeypatch):
    """Under tracing the RoPE is real arithmetic (no complex tensors); eagerly one complex product.

    Both forms are held to each other (outputs and all gradients) on the same inputs, and the
    traced graph of the op is checked to hold no complex value.
    """
    eager_backend = importlib.import_module('polaformerpp.ops.pola_attention.eager')
    q, k, v, ts, to = make_inputs(2, 2, 48, 16, seed=5, requires_grad=True)
    rope = RopeGrid(6, 8) if rope_form == 'grid' else pola_rope_tables(6, 8, 16)
    grad_out = torch.randn(2, 2, 48, 16, generator=torch.Generator().manual_seed(1))

    def run():
        out = pola_attention(q, k, v, ts, to, rope=rope, backend='torch')
        return (out, *torch.autograd.grad(out, (q, k, v, ts, to), grad_out))

    eager = run()
    with monkeypatch.context() as patch:
        patch.setattr(eager_backend, 'is_tracing', lambda: True)  # what compile / export / jit.trace report
        traced_form = run()
    for got, expected in zip(traced_form, eager):
        torch.testing.assert_close(got, expected, rtol=2e-5, atol=1e-6)

    program = torch.export.export(_Attention(rope), (q.detach(), k.detach(), v.detach()), strict=False)
    dtypes = {node.meta['val'].dtype for node in program.graph.nodes
              if isinstance(node.meta.get('val'), torch.Tensor)}
    assert torch.float32 in dtypes and not any(dtype.is_complex for dtype in dtypes), dtypes


class _Attention(torch.nn.Module):
    def __init__(self, rope):
        super().__init__()
        self.rope = rope
        self.ts = torch.nn.Parameter(torch.full((2, 32), 0.5))
        self.to_ = torch.nn.Parameter(torch.full((2, 32), 0.5))

    def forward(self, q, k, v):
        return pola_attention(q, k, v, self.ts, self.to_, rope=self.rope, backend='torch')
