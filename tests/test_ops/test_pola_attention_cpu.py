"""The fused CPU backend (compiled feature-map kernels) against the eager torch backend."""
import pytest
import torch

from ops_testing import assert_close_rel, grid_for
from polaformerpp.ops import RopeGrid, available_backends, pola_attention, pola_attention_torch, pola_rope_tables

pytestmark = pytest.mark.skipif('cpu' not in available_backends(),
                                reason='fused CPU kernels not built (tools/setup_env.sh builds them)')


def make_inputs(B, h, N, d, dv=None, seed=0, scale=1.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k = (scale * torch.randn(B, h, N, d, generator=g) for _ in range(2))
    v = torch.randn(B, h, N, dv or d, generator=g)
    ts = torch.rand(h, 2 * d, generator=g) * 0.9 + 0.05
    to = torch.rand(h, 2 * d, generator=g) * 0.9 + 0.05
    return [t.to(dtype) for t in (q, k, v)] + [ts, to]


def float64_reference(q, k, v, ts, to, rope):
    rope = tuple(t.double() for t in rope) if rope is not None else None
    return pola_attention_torch(q.double(), k.double(), v.double(), ts.double(), to.double(), rope)


@pytest.mark.parametrize('B, h, N, d', [
    (1, 1, 1, 8),      # a single token
    (2, 3, 65, 12),    # N one past a kernel block of 64 rows
    (1, 2, 200, 16),
    (2, 1, 130, 32),
    (1, 1, 333, 48),
    (1, 2, 1000, 64),
    (2, 1, 77, 96),
    (1, 1, 50, 128),
])
@pytest.mark.parametrize('use_rope', [False, True])
def test_matches_torch_backend(B, h, N, d, use_rope):
    q, k, v, ts, to = make_inputs(B, h, N, d, seed=N + d)
    rope = pola_rope_tables(*grid_for(N), d) if use_rope else None
    out = pola_attention(q, k, v, ts, to, rope=rope, backend='cpu')
    assert out.shape == (B, h, N, d) and out.dtype == torch.float32
    reference = float64_reference(q, k, v, ts, to, rope)
    assert_close_rel(out, reference, 2e-6)
    assert_close_rel(out, pola_attention(q, k, v, ts, to, rope=rope, backend='torch'), 2e-6)


@pytest.mark.parametrize('key_scale', [1.0, 25.0])
def test_token_chunks_and_value_dim(key_scale):
    """dv != d; keys up to 25 need exponent shifts: their passes run over token chunks
    (sizes that do not divide N); shift-free inputs take the block-fused passes."""
    from polaformerpp.ops.pola_attention.cpu import pola_attention_cpu
    q, k, v, ts, to = make_inputs(2, 2, 300, 16, dv=10, seed=4)
    k = (k * key_scale).clamp(-25, 25)
    rope = pola_rope_tables(15, 20, 16)
    whole = pola_attention_cpu(q, k, v, ts, to, rope, chunk_size=4096)
    for chunk in (1, 37, 128):
        assert_close_rel(pola_attention_cpu(q, k, v, ts, to, rope, chunk_size=chunk), whole, 1e-6)
    assert_close_rel(whole, float64_reference(q, k, v, ts, to, rope), 2e-6)


def test_strided_layouts_are_read_in_place():
    """The backbone's (B, N, h, d) buffer viewed as (B, h, N, d), and a non-contiguous last dim."""
    B, N, h, d = 2, 70, 3, 16
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(B, N, 3, h, d, generator=g)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (B, h, N, d) views
    ts, to = torch.rand(h, 2 * d, generator=g), torch.rand(h, 2 * d, generator=g)
    rope = pola_rope_tables(7, 10, d)
    expected = pola_attention(q.contiguous(), k.contiguous(), v.contiguous(), ts, to, rope, backend='torch')
    assert_close_rel(pola_attention(q, k, v, ts, to, rope, backend='cpu'), expected, 2e-6)
    wide = torch.randn(B, h, N, 2 * d, generator=g)
    q_strided = wide[..., ::2]  # last-dim stride 2
    assert_close_rel(pola_attention(q_strided, k, v, ts, to, rope, backend='cpu'),
                     pola_attention(q_strided.contiguous(), k, v, ts, to, rope, backend='torch'), 2e-6)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_precision_inputs(dtype):
    q, k, v, ts, to = make_inputs(1, 2, 100, 16, seed=2, dtype=dtype)
    rope = pola_rope_tables(10, 10, 16)
    out = pola_attention(q, k, v, ts, to, rope, backend='cpu')
    assert out.dtype == dtype
    assert_close_rel(out, pola_attention(q, k, v, ts, to, rope, backend='torch'), 1e-2)


def test_small_arguments_keep_relative_precision():
    """exp(x) - 1 is computed as expm1 in the kernels: tiny activations stay accurate."""
    q, k, v, ts, to = make_inputs(1, 1, 64, 16, seed=3, scale=1e-4)
    out = pola_attention(q, k, v, ts, to, backend='cpu')
    assert_close_rel(out, float64_reference(q, k, v, ts, to, None), 1e-5)


def test_large_and_special_values():
    q, k, v, ts, to = make_inputs(1, 2, 40, 8, seed=5)
    k = (k * 30).clamp(-40, 40)  # exp(k) up to ~1e17
    q = q * 8  # exp(q t) up to ~1e10: den = phi . m stays inside fp32
    out = pola_attention(q, k, v, ts, to, backend='cpu')
    assert torch.isfinite(out).all()
    assert_close_rel(out, float64_reference(q, k, v, ts, to, None), 1e-5)
    # NaN in one query row stays in that row; NaN in a key spreads to every row
    q_nan = q.clone()
    q_nan[0, 1, 7, 3] = float('nan')
    out = pola_attention(q_nan, k, v, ts, to, backend='cpu')
    assert torch.isnan(out[0, 1, 7]).all() and not torch.isnan(out[0, 1, :7]).any()
    assert not torch.isnan(out[0, 0]).any()
    k_nan = k.clone()
    k_nan[0, 0, 0, 0] = float('nan')
    assert torch.isnan(pola_attention(q, k_nan, v, ts, to, backend='cpu')[0, 0]).all()


@pytest.mark.parametrize('d', [6, 16])
def test_nan_propagates_in_the_shift_free_range(d):
    """Unshifted inputs with a NaN: the block-fused passes (scalar rows for d = 6, vector rows for
    d = 16) keep it where the method puts it."""
    q, k, v, ts, to = make_inputs(1, 2, 40, d, seed=5)
    q[0, 1, 7, 3] = float('nan')
    out = pola_attention(q, k, v, ts, to, rope=RopeGrid(5, 8), backend='cpu')
    assert torch.isnan(out[0, 1, 7]).all() and not torch.isnan(out[0, 1, :7]).any()
    assert not torch.isnan(out[0, 0]).any()
    q[0, 1, 7, 3] = 0.0
    k[0, 0, 0, 0] = float('nan')
    out = pola_attention(q, k, v, ts, to, rope=RopeGrid(5, 8), backend='cpu')
    assert torch.isnan(out[0, 0]).all() and not torch.isnan(out[0, 1]).any()


def test_rope_tables_with_two_angles_in_a_pair_are_refused():
    q, k, v, ts, to = make_inputs(1, 1, 20, 16, seed=2)
    sin, cos = pola_rope_tables(4, 5, 16)
    cos = cos.clone()
    cos[19, 20] += 0.1  # the last token, a channel of the second half
    with pytest.raises(ValueError, match='must give both channels of a rotation pair'):
        pola_attention(q, k, v, ts, to, rope=(sin, cos), backend='cpu')


def test_auto_trains_through_the_fused_kernels():
    """Under autograd ``'auto'`` runs the fused forward with its analytic backward; without, the plain kernels."""
    q, k, v, ts, to = make_inputs(1, 2, 30, 8, seed=6)
    fused = pola_attention(q, k, v, ts, to, backend='cpu')
    assert torch.equal(pola_attention(q, k, v, ts, to, backend='auto'), fused)
    q.requires_grad_(True)
    out = pola_attention(q, k, v, ts, to, backend='auto')
    assert type(out.grad_fn).__name__ == 'PolaAttentionCPUBackward'
    assert torch.equal(out.detach(), fused)
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def float64_gradients(leaves, grad_out, rope, eps=1e-6):
    """Gradients of the torch backend's autograd, in float64, for ``leaves = (q, k, v, ts, to)``."""
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    if rope is not None and not isinstance(rope, RopeGrid):  # (sin, cos) tables
        rope = tuple(t.double() for t in rope)
    out = pola_attention_torch(*leaves64, rope, eps)
    return torch.autograd.grad(out, leaves64, grad_out.double())


@pytest.mark.parametrize('B, h, N, d, dv, rope_form', [
    (1, 1, 7, 8, 8, 'grid'),      # fewer tokens than a kernel block of 64 rows
    (2, 3, 65, 12, 12, 'grid'),   # N one past a kernel block of 64 rows
    (2, 2, 200, 16, 10, 'none'),  # dv != d
    (1, 2, 300, 64, 64, 'tables'),
    (1, 1, 1100, 8, 8, 'grid'),   # three blocks of 512 tokens in the fused passes, split over threads
])
def test_gradients_match_float64_autograd(B, h, N, d, dv, rope_form):
    """The analytic backward against autograd of the eager backend in float64, every input's gradient."""
    q, k, v, ts, to = make_inputs(B, h, N, d, dv=dv, seed=N + d)
    rope = {'none': None, 'grid': RopeGrid(*grid_for(N)), 'tables': pola_rope_tables(*grid_for(N), d)}[rope_form]
    leaves = [t.requires_grad_() for t in (q, k, v, ts, to)]
    grad_out = torch.randn(B, h, N, dv, generator=torch.Generator().manual_seed(1))
    out = pola_attention(*leaves, rope=rope, backend='cpu')
    assert type(out.grad_fn).__name__ == 'PolaAttentionCPUBackward'
    grads = torch.autograd.grad(out, leaves, grad_out)
    for name, actual, expected in zip(('q', 'k', 'v', 'temp_same', 'temp_opp'), grads,
                                      float64_gradients(leaves, grad_out, rope)):
        assert actual.dtype == torch.float32, name
        assert_close_rel(actual, expected, 5e-6)


@pytest.mark.parametrize('d', [16, 12])  # vector rows; scalar rows (not a multiple of 8)
def test_backward_in_token_chunks_reads_strided_views(d):
    """Chunks that do not divide N (and the block-fused passes), on (B, h, N, d) views of one packed
    projection, and a strided output gradient."""
    from polaformerpp.ops.pola_attention.common import as_rope_halves
    from polaformerpp.ops.pola_attention.cpu import pola_attention_cpu_with_state
    from polaformerpp.ops.pola_attention.cpu_backward import pola_attention_cpu_backward
    B, h, N = 2, 2, 70
    g = torch.Generator().manual_seed(5)
    packed = torch.randn(B, N, 3 * h * d, generator=g)
    q, k, v = (t.unflatten(-1, (h, d)).transpose(1, 2) for t in packed.chunk(3, dim=-1))
    ts, to = (torch.rand(h, 2 * d, generator=g) * 0.9 + 0.05 for _ in range(2))
    grad_out = torch.randn(B, N, h, d, generator=g).transpose(1, 2)
    rope = as_rope_halves(RopeGrid(7, 10), d)
    out, state, key_mean, shifted = pola_attention_cpu_with_state(q, k, v, ts, to, rope, 1e-6)
    assert not shifted
    expected = float64_gradients((q, k, v, ts, to), grad_out, RopeGrid(7, 10))
    for chunk in (None, 13, 64, 4096):
        grads = pola_attention_cpu_backward(grad_out, q, k, v, ts, to, out, state, key_mean, rope, 1e-6, chunk)
        for actual, reference in zip(grads, expected):
            assert_close_rel(actual, reference, 5e-6)


def test_half_precision_gradients():
    """fp16/bf16 inputs: fp32 arithmetic, gradients in the inputs' dtypes."""
    q, k, v, ts, to = make_inputs(1, 2, 40, 16, seed=8)
    grad_out = torch.randn(1, 2, 40, 16, generator=torch.Generator().manual_seed(2))
    expected = float64_gradients((q, k, v, ts, to), grad_out, RopeGrid(5, 8))
    for dtype, tolerance in ((torch.float16, 5e-3), (torch.bfloat16, 4e-2)):
        leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        out = pola_attention(*leaves, ts, to, rope=RopeGrid(5, 8), backend='cpu')
        grads = torch.autograd.grad(out, leaves, grad_out.to(dtype))
        for actual, reference in zip(grads, expected):
            assert actual.dtype == dtype
            assert_close_rel(actual, reference, tolerance)


def test_inputs_needing_exponent_shifts_train_through_the_eager_backend():
    """Past the shift-free range the backward follows the shifted eager arithmetic: finite, autograd's graph."""
    q, k, v, ts, to = make_inputs(1, 1, 24, 8, seed=9, scale=60.0)
    q.requires_grad_(True)
    out = pola_attention(q, k, v, ts, to, rope=RopeGrid(4, 6), backend='cpu')
    assert type(out.grad_fn).__name__ != 'PolaAttentionCPUBackward'
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_bad_requests_raise_clear_errors():
    q, k, v, ts, to = make_inputs(1, 1, 6, 4)
    with pytest.raises(ValueError, match="backend='cpu' needs CPU tensors in fp32/fp16/bf16"):
        pola_attention(q.double(), k.double(), v.double(), ts, to, backend='cpu')


def test_backbone_inference_matches_torch_backend():
    from conftest import linear_backbones
    fused, reference = linear_backbones('cpu', 'torch')
    image = torch.randn(2, 3, 64, 72)
    with torch.no_grad():
        for a, b in zip(fused(image), reference(image)):
            assert_close_rel(a, b, 1e-5)


def test_rope_tables_with_other_strides():
    """sin and cos need not share a layout: a cos table sliced out of a wider buffer reads the same."""
    q, k, v, ts, to = make_inputs(1, 2, 35, 8, seed=7)
    sin, cos = pola_rope_tables(5, 7, 8)
    wide = torch.zeros(35, 40)
    wide[:, 3:19] = cos
    out = pola_attention(q, k, v, ts, to, rope=(sin, wide[:, 3:19]), backend='cpu')
    assert_close_rel(out, pola_attention(q, k, v, ts, to, rope=(sin, cos), backend='cpu'), 1e-7)


@pytest.mark.parametrize('B,h,N,d,use_rope,chunk', [(2, 1, 48, 8, True, None), (1, 3, 35, 8, False, None),
                                                    (2, 2, 30, 6, True, 7), (1, 2, 600, 32, True, None)])
def test_gated_epilogue_matches_plain_form(B, h, N, d, use_rope, chunk):
    """The fused readout (products onto the LePE term, token layout, gate per block) equals
    ``(merge(attn) + lepe) * gate`` from the torch backend, on strided views of one projection
    (d = 6: the scalar rows, d = 32: the vector rows, N = 600: two token blocks)."""
    from polaformerpp.ops import gated_output
    from polaformerpp.ops.pola_attention.cpu import pola_attention_cpu
    g = torch.Generator().manual_seed(3)
    proj = torch.randn(B, N, 4 * h * d, generator=g)  # [q | k | v | gate], as in_proj writes it
    q, k, v, gate = proj.chunk(4, dim=-1)
    q, k, v = (t.unflatten(-1, (h, d)).transpose(1, 2) for t in (q, k, v))
    lepe = torch.randn(B, N, h * d, generator=g)
    ts, to = (torch.rand(h, 2 * d, generator=g) * 0.9 + 0.05 for _ in range(2))
    rope = RopeGrid(*grid_for(N)) if use_rope else None
    expected = gated_output(pola_attention_torch(q, k, v, ts, to, rope), lepe, gate)
    lepe_before = lepe.clone()
    out = pola_attention_cpu(q, k, v, ts, to, rope, chunk_size=chunk, lepe=lepe, gate=gate)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(lepe, lepe_before)  # not writable: a copy carries the sum
    writable = lepe.clone()
    out = pola_attention_cpu(q, k, v, ts, to, rope, chunk_size=chunk, lepe=writable, gate=gate, lepe_writable=True)
    assert out.data_ptr() == writable.data_ptr()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
