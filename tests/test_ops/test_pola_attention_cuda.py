"""The Triton kernels run on a CUDA device, against float64 references (skipped without one).

CPU CI covers the kernels through the interpreter (``test_pola_attention_triton.py``);
these tests run them compiled, on CUDA tensors: forward and all five gradients
for every head dim the models use, fp32 (``tl.dot`` in three-pass TF32, about
fp32 accuracy: held to 1e-4 of the largest reference value), fp16 and bf16
(1e-2, their own rounding), N from 1 to past 64K, every RoPE form, strided
``(B, N, h, d)`` views, every autotuned configuration, the exponent shifts of
large inputs, the dispatcher and a backbone forward/backward.

The reference is the eager backend in float64 (held to the quadratic form to
1e-9 by ``test_pola_attention_torch.py``), on the inputs rounded to the tested dtype.

Triton decides when the kernels are defined whether they run interpreted
(``TRITON_INTERPRET=1``, which the interpreter tests set): in a process where
that happened first these tests skip; run them in a process of their own
(``pytest tests/test_ops/test_pola_attention_cuda.py``, or ``make gpu-check``).
Most tests pin one kernel configuration (``fixed_config``), so each
specialisation is built once instead of once per autotuned configuration.
"""
import os
import sys

import pytest
import torch


def _skip_reason():
    if not torch.cuda.is_available():
        return ('no CUDA device (torch.cuda.is_available() is False); the Triton kernels are tested through the '
                'interpreter in test_pola_attention_triton.py')
    try:
        import triton  # noqa: F401
    except ImportError:
        return 'triton is not installed'
    kernels = sys.modules.get('polaformerpp.ops.pola_attention.triton_kernels')
    interpreted = kernels.INTERPRET if kernels is not None else os.environ.get('TRITON_INTERPRET') == '1'
    if interpreted:
        return ('the Triton kernels run interpreted in this process (TRITON_INTERPRET=1 was set before they were '
                'defined, e.g. by test_pola_attention_triton.py): run this file in a process of its own, '
                'pytest tests/test_ops/test_pola_attention_cuda.py (make gpu-check does)')
    return None


_SKIP_REASON = _skip_reason()
if _SKIP_REASON:
    pytest.skip(_SKIP_REASON, allow_module_level=True)

from polaformerpp.ops import RopeGrid, pola_attention, pola_attention_torch, pola_rope_tables  # noqa: E402
from polaformerpp.ops.pola_attention import triton_kernels  # noqa: E402
from polaformerpp.ops.pola_attention.common import needs_exponent_shift  # noqa: E402
from polaformerpp.ops.pola_attention.triton_ops import pola_attention_triton  # noqa: E402

DEVICE = 'cuda'
NAMES = ('out', 'dq', 'dk', 'dv', 'dtemp_same', 'dtemp_opp')
RTOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}
#: absolute floors, for gradients that are zero up to rounding (the query gradients at N = 1,
#: where the output depends on the query only through eps)
ATOL = {torch.float32: 1e-5, torch.float16: 1e-4, torch.bfloat16: 1e-4}
HEAD_DIMS = (12, 16, 32, 64, 96, 128)  # every head dim of b0-b5 and the task models


@pytest.fixture(autouse=True)
def one_config():
    """One kernel configuration (a build per specialisation) unless a test asks for the autotuner."""
    with triton_kernels.fixed_config():
        yield


def make_inputs(batch, heads, num_tokens, head_dim, dtype, scale=1.0, uniform=False, seed=0):
    """``q, k, v`` ``(B, h, N, d)`` in ``dtype`` on the device, fp32 temperatures ``(h, 2d)`` in
    (0.05, 0.95) and an output gradient; ``uniform``: ``q, k`` uniform in ``[-scale, scale]``."""
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, heads, num_tokens, head_dim)
    if uniform:
        q, k = (scale * (2 * torch.rand(shape, generator=gen) - 1) for _ in range(2))
    else:
        q, k = (scale * torch.randn(shape, generator=gen) for _ in range(2))
    v = torch.randn(shape, generator=gen)
    temps = [0.05 + 0.9 * torch.rand(heads, 2 * head_dim, generator=gen) for _ in range(2)]
    inputs = [t.to(DEVICE, dtype) for t in (q, k, v)] + [t.to(DEVICE) for t in temps]
    return [t.requires_grad_() for t in inputs], torch.randn(shape, generator=gen).to(DEVICE, dtype)


def output_and_grads(fn, inputs, grad_out, **kwargs):
    out = fn(*inputs, **kwargs)
    return (out, *torch.autograd.grad(out, inputs, grad_out))


def float64_reference(inputs, grad_out, rope):
    """The eager backend in float64 on the (rounded) inputs: output and the five gradients."""
    inputs64 = [t.detach().double().requires_grad_() for t in inputs]
    tables = None if rope is None else pola_rope_tables(*rope, inputs[0].shape[-1], device=DEVICE,
                                                        dtype=torch.float64)
    return output_and_grads(pola_attention_torch, inputs64, grad_out.double(), rope=tables)


def assert_matches(actual, expected, rtol, what='', atol=0.0):
    """Each tensor finite and within ``rtol`` of the largest magnitude of its reference (plus ``atol``)."""
    for name, a, e in zip(NAMES, actual, expected):
        assert torch.isfinite(a).all(), f'{what} {name}: not finite'
        err = (a.double() - e).abs().max().item()
        bound = rtol * e.abs().max().item() + atol
        assert err <= bound, f'{what} {name}: max abs error {err:.3e} > {bound:.3e}'


def check_against_float64(batch, heads, num_tokens, head_dim, dtype, rope='grid', expect_shift=False,
                          **input_kwargs):
    """Output and gradients of the kernels against :func:`float64_reference`; ``rope``: None, 'grid'
    (``RopeGrid``) or 'tables' (``(N, 2d)`` tables); ``expect_shift``: whether the inputs leave the
    shift-free range (asserted)."""
    inputs, grad_out = make_inputs(batch, heads, num_tokens, head_dim, dtype, **input_kwargs)
    assert needs_exponent_shift(inputs[0], inputs[1], inputs[3], inputs[4]) == expect_shift
    grid = _grid(num_tokens) if rope else None
    fused_rope = {None: None, 'grid': RopeGrid(*grid) if grid else None,
                  'tables': pola_rope_tables(*grid, head_dim, device=DEVICE) if grid else None}[rope]
    actual = output_and_grads(pola_attention_triton, inputs, grad_out, rope=fused_rope)
    assert actual[0].dtype == dtype and actual[1].dtype == dtype
    assert_matches(actual, float64_reference(inputs, grad_out, grid), RTOL[dtype],
                   f'd={head_dim} N={num_tokens} {dtype} rope={rope}', ATOL[dtype])


def _grid(n):
    height = int(n ** 0.5)
    while n % height:
        height -= 1
    return height, n // height


@pytest.mark.parametrize('head_dim,dtype', [(d, torch.float32) for d in HEAD_DIMS]
                         + [(d, torch.bfloat16) for d in HEAD_DIMS] + [(64, torch.float16)])
def test_head_dims_and_dtypes(head_dim, dtype):
    """Every head dim with the models' RoPE grid; N = 37 * 29 is no multiple of a tile."""
    check_against_float64(2, 2, 37 * 29, head_dim, dtype)


@pytest.mark.parametrize('num_tokens', [1, 2, 17, 4099, 65536 + 257])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_sequence_lengths(num_tokens, dtype):
    """From one token to past 64K (several reduction chunks per program at the long end)."""
    check_against_float64(1, 2, num_tokens, 64, dtype)


@pytest.mark.parametrize('rope', [None, 'tables'])
def test_rope_forms(rope):
    """No RoPE and (N, 2d) tables (the grid form runs everywhere else)."""
    check_against_float64(2, 1, 23 * 31, 32, torch.float32, rope=rope)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_strided_backbone_layout(dtype):
    """q, k, v as (B, N, h, d) views of one projection buffer and a non-contiguous output gradient:
    no copies, the same results."""
    batch, heads, height, width, head_dim = 2, 2, 24, 20, 64
    num_tokens, channels = height * width, heads * head_dim
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(batch, num_tokens, 4 * channels, generator=gen).to(DEVICE, dtype)
    q, k, v, _ = (t.reshape(batch, num_tokens, heads, head_dim).transpose(1, 2) for t in qkv.chunk(4, dim=-1))
    assert not q.is_contiguous()
    temps = [(0.05 + 0.9 * torch.rand(heads, 2 * head_dim, generator=gen)).to(DEVICE) for _ in range(2)]
    inputs = [t.detach().requires_grad_() for t in (q, k, v, *temps)]
    grad_out = torch.randn(batch, num_tokens, heads, head_dim, generator=gen).to(DEVICE, dtype).transpose(1, 2)
    actual = output_and_grads(pola_attention_triton, inputs, grad_out, rope=RopeGrid(height, width))
    assert_matches(actual, float64_reference(inputs, grad_out, (height, width)), RTOL[dtype], 'strided',
                   ATOL[dtype])
    contiguous = [t.detach().contiguous().requires_grad_() for t in inputs]
    again = output_and_grads(pola_attention_triton, contiguous, grad_out.contiguous(), rope=RopeGrid(height, width))
    for name, a, b in zip(NAMES, actual, again):
        assert torch.equal(a, b), name


AUTOTUNE_HEAD_DIM, AUTOTUNE_GRID = 64, (64, 64)
#: what the autotuner may pick at that head dim: (BLOCK_N, num_warps, num_stages)
AUTOTUNE_SHAPES = [(c.kwargs['BLOCK_N'], c.num_warps, c.num_stages)
                   for c in triton_kernels.kernel_configs(AUTOTUNE_HEAD_DIM)]


@pytest.fixture(scope='module')
def autotune_case():
    """Inputs, output gradient and float64 reference at the benchmark's shape class (d = 64, bf16,
    RoPE grid), which these tests also build the kernels of (for the benchmark and the training step)."""
    inputs, grad_out = make_inputs(1, 1, AUTOTUNE_GRID[0] * AUTOTUNE_GRID[1], AUTOTUNE_HEAD_DIM, torch.bfloat16)
    return inputs, grad_out, float64_reference(inputs, grad_out, AUTOTUNE_GRID)


@pytest.mark.parametrize('shape', AUTOTUNE_SHAPES, ids=lambda s: 'block{}-warps{}-stages{}'.format(*s))
def test_autotuned_config(shape, autotune_case):
    """Each configuration the autotuner may pick gives the right results."""
    inputs, grad_out, expected = autotune_case
    with triton_kernels.fixed_config(*shape):
        actual = output_and_grads(pola_attention_triton, inputs, grad_out, rope=RopeGrid(*AUTOTUNE_GRID))
    assert_matches(actual, expected, 1e-2, str(shape), 1e-4)


def test_autotuner_picks_one_of_them(autotune_case):
    """The autotuner itself (not the pinned configuration of the other tests): right results, and
    every kernel ran one of :data:`AUTOTUNE_SHAPES`."""
    inputs, grad_out, expected = autotune_case
    saved = {name: kernel.configs for name, kernel in triton_kernels.KERNELS.items()}
    try:
        for kernel in triton_kernels.KERNELS.values():  # the autotuner's own list, not the autouse pin
            kernel.configs = triton_kernels.kernel_configs()
        actual = output_and_grads(pola_attention_triton, inputs, grad_out, rope=RopeGrid(*AUTOTUNE_GRID))
        chosen = {name: kernel.best_config for name, kernel in triton_kernels.KERNELS.items()}
    finally:
        for name, kernel in triton_kernels.KERNELS.items():
            kernel.configs = saved[name]
    assert_matches(actual, expected, 1e-2, 'autotuned', 1e-4)
    for name, config in chosen.items():
        assert (config.kwargs['BLOCK_N'], config.num_warps, config.num_stages) in AUTOTUNE_SHAPES, (name, config)


# |x| of order `scale` (uniform): without RoPE the exact output is bounded by max |v| at any
# scale; with RoPE it grows like exp(|x|), so gradients are held where they fit comfortably.
@pytest.mark.parametrize('scale,rope,dtype', [(30.0, None, torch.float32), (100.0, None, torch.float32),
                                              (25.0, 'grid', torch.float32), (300.0, None, torch.bfloat16)])
def test_large_inputs_are_overflow_free(scale, rope, dtype):
    """Exponents far past fp32's exp range: the shifted kernels keep everything finite and exact."""
    check_against_float64(1, 2, 24 * 20, 64, dtype, rope=rope, expect_shift=True, scale=scale, uniform=True)


def test_shift_only_where_needed_and_zero_queries():
    """Normal inputs run the unshifted kernels (bit for bit); the shifted ones agree to rounding;
    all-zero queries give exactly zero output with and without the shift."""
    inputs, grad_out = make_inputs(1, 2, 24 * 20, 64, torch.float32, scale=2.0)
    assert not needs_exponent_shift(inputs[0], inputs[1], inputs[3], inputs[4])
    rope = RopeGrid(24, 20)
    default = output_and_grads(pola_attention_triton, inputs, grad_out, rope=rope)
    unshifted = output_and_grads(pola_attention_triton, inputs, grad_out, rope=rope, shifted=False)
    shifted = output_and_grads(pola_attention_triton, inputs, grad_out, rope=rope, shifted=True)
    for name, a, b, c in zip(NAMES, default, unshifted, shifted):
        assert torch.equal(a, b), name
        assert_matches((c,), (b.double(),), 1e-5, f'shifted {name}', 1e-7)
    for scale in (1.0, 100.0):
        inputs, _ = make_inputs(1, 2, 24 * 20, 64, torch.float32, scale=scale, uniform=True)
        with torch.no_grad():
            inputs[0][:, :, ::3] = 0
            out = pola_attention_triton(*inputs, rope=rope)
        assert torch.equal(out[:, :, ::3], torch.zeros_like(out[:, :, ::3])), scale
        assert torch.isfinite(out).all() and out[:, :, 1::3].abs().sum() > 0, scale


def test_dispatcher_picks_triton_on_cuda():
    inputs, _ = make_inputs(1, 2, 300, 64, torch.bfloat16)
    inputs = [t.detach() for t in inputs]
    auto = pola_attention(*inputs, rope=RopeGrid(15, 20), backend='auto')
    assert torch.equal(auto, pola_attention_triton(*inputs, rope=RopeGrid(15, 20)))


def test_backbone_triton_equals_torch():
    """A tiny all-linear backbone on the device: outputs and every parameter gradient."""
    from conftest import linear_backbones
    models = [model.to(DEVICE) for model in linear_backbones('torch', 'triton')]
    image = torch.randn(2, 3, 96, 80, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    results = []
    for model in models:
        outs = model(image)
        loss = sum((out * torch.linspace(-1, 1, out.numel(), device=DEVICE).view_as(out)).sum() for out in outs)
        loss.backward()
        results.append((outs, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (ref_outs, ref_grads), (outs, grads) = results
    for i, (a, e) in enumerate(zip(outs, ref_outs)):
        assert (a - e).abs().max() <= 1e-4 * e.abs().max() + 1e-6, f'out{i}'
    assert any('temp_same' in n for n in grads)
    for name, g in ref_grads.items():
        assert (grads[name] - g).abs().max() <= 1e-3 * g.abs().max() + 1e-6, f'grad of {name}'
