"""The fused Triton backend of ``pola_attention`` against the torch backend and the float64 reference.

Runs on CPU through the Triton interpreter, so sizes are tiny. The
environment variable must be set before Triton (or polaformerpp, which may
import it) is imported. ``test_pola_attention_cuda.py`` runs the kernels on a GPU.
"""
import os
import sys
from functools import partial

# Triton picks interpreter mode when it is imported; a process that imported it
# before this line (without the variable) cannot run these tests on CPU tensors.
_TRITON_PREIMPORTED = 'triton' in sys.modules and os.environ.get('TRITON_INTERPRET') != '1'
os.environ['TRITON_INTERPRET'] = '1'

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip('triton')
if _TRITON_PREIMPORTED:
    pytest.skip('triton was imported before TRITON_INTERPRET=1 was set; run this file on its own '
                'or set the variable in conftest.py', allow_module_level=True)

from ops_testing import float64_quadratic  # noqa: E402
from polaformerpp.ops import RopeGrid, available_backends, pola_attention, pola_attention_torch, pola_rope_tables  # noqa: E402
from polaformerpp.ops.pola_attention import triton_ops  # noqa: E402
from polaformerpp.ops.pola_attention.common import as_rope_halves, needs_exponent_shift  # noqa: E402

pola_attention_triton = triton_ops.pola_attention_triton

GRAD_NAMES = ('q', 'k', 'v', 'temp_same', 'temp_opp')
# Relative tolerance (of the reference's largest magnitude) and an absolute floor
# for quantities that are zero up to rounding (e.g. the temperature gradients at N = 1,
# where the output no longer depends on the query up to eps).
TOLERANCES = {torch.float32: (1e-4, 1e-5), torch.float16: (1e-2, 1e-4), torch.bfloat16: (1e-2, 1e-4)}


def make_inputs(batch, heads, height, width, head_dim, rope, dtype, scale=1.0, seed=0):
    """Random ``q, k, v`` ``(B, h, N, d)`` in ``dtype``, fp32 temperatures in (0, 1), RoPE tables
    and an output gradient; every tensor that has a gradient requires it."""
    gen = torch.Generator().manual_seed(seed)
    num_tokens = height * width
    q, k, v = (scale * torch.randn(batch, heads, num_tokens, head_dim, generator=gen) for _ in range(3))
    q, k, v = (t.to(dtype).requires_grad_() for t in (q, k, v))
    temp_same = torch.rand(heads, 2 * head_dim, generator=gen).requires_grad_()
    temp_opp = torch.rand(heads, 2 * head_dim, generator=gen).requires_grad_()
    tables = pola_rope_tables(height, width, head_dim) if rope else None
    grad_out = torch.randn(batch, heads, num_tokens, head_dim, generator=gen).to(dtype)
    return (q, k, v, temp_same, temp_opp), tables, grad_out


def output_and_grads(fn, inputs, rope, grad_out):
    out = fn(*inputs, rope)
    return (out, *torch.autograd.grad(out, inputs, grad_out))


def assert_close_rel(actual, expected, rtol, atol, name):
    assert actual.shape == expected.shape, name
    assert actual.dtype == expected.dtype, name
    actual, expected = actual.double(), expected.double()
    err = (actual - expected).abs().max().item()
    bound = rtol * expected.abs().max().item() + atol
    assert err <= bound, f'{name}: max abs error {err:.3e} > {bound:.3e}'


CASES = [
    # batch, heads, height, width, head_dim, rope, dtype
    (1, 1, 1, 1, 16, True, torch.float32),      # N = 1
    (1, 2, 1, 1, 12, False, torch.float32),     # N = 1, d = 12
    (2, 1, 5, 7, 12, True, torch.float32),      # N = 35: not a multiple of the tile (16) or chunk (32)
    (1, 1, 4, 4, 96, True, torch.float32),      # d = 96 (padded to 2 x 64)
    (1, 2, 3, 11, 32, False, torch.float32),    # N = 33: a chunk holding one token
    (1, 1, 6, 8, 48, True, torch.float32),      # d = 48
    (2, 1, 7, 9, 64, True, torch.float32),      # N = 63, d = 64
    (1, 1, 5, 5, 128, False, torch.float32),    # d = 128
    (1, 2, 4, 5, 16, True, torch.float16),
    (2, 1, 3, 7, 32, True, torch.bfloat16),
    (1, 1, 9, 9, 64, False, torch.bfloat16),
    # RoPE from row/column tables (RopeGrid): rows past a tile / chunk boundary, several widths
    (2, 2, 5, 7, 12, 'grid', torch.float32),
    (1, 1, 7, 9, 64, 'grid', torch.float32),
    (1, 2, 3, 11, 32, 'grid', torch.bfloat16),
]


@pytest.mark.parametrize('batch,heads,height,width,head_dim,rope,dtype', CASES)
def test_forward_and_gradients_match_torch(batch, heads, height, width, head_dim, rope, dtype):
    """Against the torch backend with (N, 2d) tables; 'grid' runs the kernels on RopeGrid(H, W)."""
    inputs, tables, grad_out = make_inputs(batch, heads, height, width, head_dim, bool(rope), dtype)
    expected = output_and_grads(pola_attention_torch, inputs, tables, grad_out)
    fused_rope = RopeGrid(height, width) if rope == 'grid' else tables
    actual = output_and_grads(pola_attention_triton, inputs, fused_rope, grad_out)
    rtol, atol = TOLERANCES[dtype]
    for name, a, e in zip(('out',) + GRAD_NAMES, actual, expected):
        assert_close_rel(a, e, rtol, atol, name)


def test_backbone_layout_without_copy():
    """q, k, v as the (B, N, h, d) views of one projection buffer, non-contiguous grad_out."""
    batch, heads, height, width, head_dim = 2, 2, 3, 5, 16
    num_tokens, channels = height * width, heads * head_dim
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(batch, num_tokens, 3 * channels, generator=gen, requires_grad=True)
    q, k, v = (t.reshape(batch, num_tokens, heads, head_dim).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
    assert not q.is_contiguous()
    temps = [torch.rand(heads, 2 * head_dim, generator=gen, requires_grad=True) for _ in range(2)]
    tables = pola_rope_tables(height, width, head_dim)
    grad_out = torch.randn(batch, num_tokens, heads, head_dim, generator=gen).transpose(1, 2)
    inputs = (q, k, v, *temps)
    leaves = (qkv, *temps)
    results = []
    for fn in (pola_attention_torch, pola_attention_triton):
        out = fn(*inputs, tables)
        results.append((out, *torch.autograd.grad(out, leaves, grad_out)))
    for name, a, e in zip(('out', 'qkv', 'temp_same', 'temp_opp'), results[1], results[0]):
        assert_close_rel(a, e, 1e-4, 1e-6, name)


def test_small_inputs_are_accurate():
    """|x| ~ 1e-3: exp(x) - 1 must not cancel (compared with a float64 reference)."""
    inputs, tables, grad_out = make_inputs(1, 1, 4, 6, 16, True, torch.float32, scale=1e-3)
    actual = output_and_grads(pola_attention_triton, inputs, tables, grad_out)
    inputs64 = tuple(t.detach().double().requires_grad_() for t in inputs)
    tables64 = tuple(t.double() for t in tables)
    expected = output_and_grads(pola_attention_torch, inputs64, tables64, grad_out.double())
    for name, a, e in zip(('out',) + GRAD_NAMES, actual, expected):
        assert_close_rel(a.double(), e, 1e-4, 0.0, name)


def test_half_precision_large_inputs_stay_finite():
    """|x| up to ~30: exp overflows fp16 (65504 at 11.1) unless computed in fp32.

    Without RoPE each output is a convex combination of values, so it must stay finite.
    """
    inputs, tables, grad_out = make_inputs(1, 1, 4, 4, 16, False, torch.float16, scale=10.0)
    actual = output_and_grads(pola_attention_triton, inputs, tables, grad_out)
    expected = output_and_grads(pola_attention_torch, inputs, tables, grad_out)
    assert torch.isfinite(actual[0]).all()
    assert_close_rel(actual[0], expected[0], 1e-2, 1e-3, 'out')


def uniform_inputs(height, width, head_dim, dtype, scale, rope, seed=0):
    """``q, k`` uniform in ``[-scale, scale]`` (``|x|`` of order ``scale``), ``v`` in ``[-1, 1]``,
    temperatures in (0.05, 0.95), one batch element and head; RoPE tables or None and an output gradient."""
    gen = torch.Generator().manual_seed(seed)
    shape = (1, 1, height * width, head_dim)
    q, k = (scale * (2 * torch.rand(shape, generator=gen) - 1) for _ in range(2))
    v = 2 * torch.rand(shape, generator=gen) - 1
    temps = [0.05 + 0.9 * torch.rand(1, 2 * head_dim, generator=gen) for _ in range(2)]
    inputs = tuple(t.to(dtype).requires_grad_() for t in (q, k, v)) + tuple(t.requires_grad_() for t in temps)
    tables = pola_rope_tables(height, width, head_dim) if rope else None
    return inputs, tables, torch.randn(shape, generator=gen).to(dtype)


def float64_output_and_grads(inputs, tables, grad_out):
    """The quadratic reference in float64 on the (rounded) inputs, and its five gradients."""
    inputs64 = tuple(t.detach().double().requires_grad_() for t in inputs)
    out = float64_quadratic(*inputs64, tables)
    return (out, *torch.autograd.grad(out, inputs64, grad_out.double()))


# |x| = scale, RoPE, dtype, gradients too (see the test's docstring).
LARGE_CASES = [(30.0, False, torch.float32, True), (100.0, False, torch.float32, True),
               (25.0, True, torch.float32, True), (30.0, True, torch.float32, False),
               (300.0, False, torch.float16, True), (300.0, False, torch.bfloat16, True)]


@pytest.mark.parametrize('scale,rope,dtype,with_grads', LARGE_CASES)
def test_large_inputs_match_float64(scale, rope, dtype, with_grads):
    """exp overflows fp32 at 88.7: the exponent shifts keep outputs and gradients finite and equal to
    the float64 reference (1e-4 of its largest value in fp32, 1e-2 for fp16/bf16 inputs).

    ``q, k`` are uniform in ``[-scale, scale]``. Without RoPE the exact output is bounded by
    max |v| at any scale; with RoPE the rotation breaks positivity and the exact output itself
    grows like exp(|x|) (~1e24 at 30, beyond fp32 at 100), so RoPE is checked forward at 30 and
    with gradients at 25 (just past the shift-free range), where the exact ones fit comfortably.
    fp16/bf16: 300 is about the largest scale at which the float64 reference's features (exp of
    a query exponent plus a key exponent) stay finite.
    """
    inputs, tables, grad_out = uniform_inputs(3, 5, 16, dtype, scale, rope)
    assert needs_exponent_shift(*inputs[:2], *inputs[3:])
    fused_rope = RopeGrid(3, 5) if rope else None
    if with_grads:
        actual = output_and_grads(pola_attention_triton, inputs, fused_rope, grad_out)
        expected = float64_output_and_grads(inputs, tables, grad_out)
    else:
        with torch.no_grad():
            actual = (pola_attention_triton(*inputs, fused_rope),)
            expected = (float64_quadratic(*(t.double() for t in inputs), tables),)
    rtol = 1e-4 if dtype == torch.float32 else 1e-2
    for name, a, e in zip(('out',) + GRAD_NAMES, actual, expected):
        assert torch.isfinite(a).all(), name
        assert_close_rel(a.double(), e, rtol, 0.0, name)


def test_shift_only_where_needed_and_at_rounding_level():
    """Inputs in the shift-free range run the unshifted kernels (today's arithmetic, bit for bit);
    the shifted kernels (what compiled graphs run) give the same results to fp32 rounding."""
    inputs, tables, grad_out = make_inputs(1, 1, 3, 5, 16, True, torch.float32, scale=2.0)
    assert not needs_exponent_shift(*inputs[:2], *inputs[3:])
    default = output_and_grads(pola_attention_triton, inputs, tables, grad_out)
    with torch.no_grad():
        assert torch.equal(default[0], pola_attention_triton(*inputs, tables, shifted=False))
    shifted = output_and_grads(partial(pola_attention_triton, shifted=True), inputs, tables, grad_out)
    for name, a, b in zip(('out',) + GRAD_NAMES, shifted, default):
        assert_close_rel(a, b, 1e-5, 1e-7, name)


# (the interpreter evaluates both sides of tl.where, and numpy warns about the side not taken)
@pytest.mark.filterwarnings('ignore:overflow encountered:RuntimeWarning')
@pytest.mark.parametrize('scale', [1.0, 100.0])
def test_zero_queries_give_zero_output(scale):
    """All-zero query rows give exactly zero (not NaN), with and without the shift; eps keeps its meaning."""
    inputs, _, grad_out = uniform_inputs(2, 3, 16, torch.float32, scale, False)
    with torch.no_grad():
        inputs[0][:, :, ::2] = 0.0  # every other token
    out, *grads = output_and_grads(pola_attention_triton, inputs, RopeGrid(2, 3), grad_out)
    assert torch.equal(out[:, :, ::2], torch.zeros_like(out[:, :, ::2]))
    assert out[:, :, 1::2].abs().sum() > 0
    assert all(torch.isfinite(g).all() for g in grads)


def test_dispatcher_selects_triton():
    inputs, tables, _ = make_inputs(1, 2, 3, 4, 16, True, torch.float32)
    inputs = tuple(t.detach() for t in inputs)
    expected = pola_attention(*inputs, rope=tables, backend='torch')
    actual = pola_attention(*inputs, rope=tables, backend='triton')
    assert_close_rel(actual, expected, 1e-4, 1e-6, 'out')
    # 'auto' keeps CPU tensors on the CPU backends (fused when built, no grad recorded).
    cpu_backend = 'cpu' if 'cpu' in available_backends() else 'torch'
    assert torch.equal(pola_attention(*inputs, rope=tables, backend='auto'),
                       pola_attention(*inputs, rope=tables, backend=cpu_backend))


def test_torch_compile_full_graph():
    """The kernels sit behind custom ops, so torch.compile traces them without a graph break."""
    inputs, tables, grad_out = make_inputs(1, 2, 3, 4, 16, True, torch.float32)

    def loss_fn(q, k, v, temp_same, temp_opp):
        out = pola_attention(q, k, v, temp_same, temp_opp, rope=tables, backend='triton')
        return (out * grad_out).sum()

    expected = torch.autograd.grad(loss_fn(*inputs), inputs)
    compiled = torch.compile(loss_fn, backend='aot_eager', fullgraph=True)
    actual = torch.autograd.grad(compiled(*inputs), inputs)
    for name, a, e in zip(GRAD_NAMES, actual, expected):
        assert_close_rel(a, e, 1e-6, 1e-7, name)


def test_rope_tables_with_other_strides():
    """sin and cos need not share a layout: a cos table sliced out of a wider buffer reads the same."""
    inputs, tables, _ = make_inputs(1, 2, 5, 7, 16, True, torch.float32)
    inputs = tuple(t.detach() for t in inputs)
    sin, cos = tables
    wide = torch.zeros(35, 40)
    wide[:, 5:37] = cos
    expected = pola_attention_triton(*inputs, (sin, cos))
    assert_close_rel(pola_attention_triton(*inputs, (sin, wide[:, 5:37])), expected, 1e-6, 0.0, 'out')


@pytest.mark.parametrize('rope,shifted', [('tables', False), ('grid', True)])
def test_custom_op_registration(rope, shifted):
    inputs, tables, _ = make_inputs(1, 1, 2, 3, 16, True, torch.float32)
    q, k, v, temp_same, temp_opp = inputs
    temps = torch.stack([temp_same, temp_opp]).detach().requires_grad_()
    rope_args = triton_ops.kernel_rope_args(as_rope_halves(RopeGrid(2, 3) if rope == 'grid' else tables, 16, q.device))
    op = torch.ops.polaformerpp.pola_attention_triton_fwd
    torch.library.opcheck(op, (q, k, v, temps, *rope_args, 1e-6, shifted, False),
                          test_utils=('test_schema', 'test_autograd_registration', 'test_faketensor'))


def test_unsupported_inputs_raise():
    inputs, _, _ = make_inputs(1, 1, 2, 2, 16, False, torch.float32)
    q, k, v, temp_same, temp_opp = (t.detach() for t in inputs)
    with pytest.raises(ValueError, match='head dim of v'):
        pola_attention_triton(q, k, v[..., :8], temp_same, temp_opp)
    with pytest.raises(ValueError, match='float64'):
        pola_attention_triton(q.double(), k.double(), v.double(), temp_same, temp_opp)


@pytest.mark.slow  # about 20 s of ptxas on a small CPU: past the default set's budget
def test_kernels_compile_for_gpu_targets():
    """The interpreter does not check what a GPU build checks (dot shapes, layouts, types):
    compile every kernel for sm_90 and sm_80 ahead of time (no GPU needed, ptxas is)."""
    import subprocess

    from conftest import REPO_ROOT
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    env['PYTHONPATH'] = REPO_ROOT + os.pathsep + env.get('PYTHONPATH', '')
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'triton_aot_compile.py')
    proc = subprocess.run([sys.executable, script], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode == 3:
        pytest.skip(proc.stdout.strip())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_backbone_triton_equals_torch():
    from conftest import linear_backbones
    reference, fused = linear_backbones('torch', 'triton')

    image = torch.randn(1, 3, 48, 40)
    results = []
    for model in (reference, fused):
        outs = model(image)
        loss = sum((out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum() for out in outs)
        loss.backward()
        results.append((outs, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (ref_outs, ref_grads), (outs, grads) = results
    assert len(outs) == 4
    for i, (a, e) in enumerate(zip(outs, ref_outs)):
        assert_close_rel(a, e, 1e-4, 1e-6, f'out{i}')
    assert any('temp_same' in n for n in grads)
    for name, g in ref_grads.items():
        assert_close_rel(grads[name], g, 1e-3, 1e-6, f'grad of {name}')
