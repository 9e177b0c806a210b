"""The CPU training forms of gelu(linear(x)) and of the layer-scale residual after a product,
against autograd of their plain forms."""
import pytest
import torch
import torch.nn.functional as F

from polaformerpp.ops.library import kernels
from polaformerpp.ops.linear_gelu import linear_gelu, linear_gelu_kernel_applies
from polaformerpp.ops.linear_residual import drop_path_scales, linear_residual_kernel_applies, linear_scaled_residual

pytestmark = pytest.mark.skipif(kernels is None, reason='the CPU kernels are not built')


@pytest.mark.parametrize('out_features', [48, 21])  # a multiple of the 16 lanes, and a tail
@pytest.mark.parametrize('with_bias', [True, False])
@pytest.mark.parametrize('frozen', [(), ('weight', )])
def test_linear_gelu_equals_autograd_of_the_plain_form(out_features, with_bias, frozen):
    gen = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(2, 5, 7, 12, generator=gen)).requires_grad_()
    weight = torch.randn(out_features, 12, generator=gen).requires_grad_('weight' not in frozen)
    bias = torch.randn(out_features, generator=gen).requires_grad_() if with_bias else None
    grad = torch.randn(2, 5, 7, out_features, generator=gen)
    params = [t for t in (x, weight, bias) if t is not None and t.requires_grad]
    assert linear_gelu_kernel_applies(x, weight, bias)
    out = linear_gelu(x, weight, bias)
    expected = F.gelu(F.linear(x, weight, bias))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for got, want in zip(torch.autograd.grad(out, params, grad), torch.autograd.grad(expected, params, grad)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_linear_gelu_tails_and_non_finite_values():
    """Large negative and positive pre-activations keep their limits; NaN propagates."""
    h = torch.tensor([[-40.0, -8.0, -5.0, -1e-30, 0.0, 1e-30, 5.0, 40.0, float('nan')]])
    torch.testing.assert_close(kernels.bias_gelu(h), F.gelu(h), rtol=1e-5, atol=1e-6, equal_nan=True)
    grad = torch.ones_like(h)
    torch.testing.assert_close(kernels.bias_gelu_backward(grad, h)[0], torch.ops.aten.gelu_backward(grad, h),
                               rtol=1e-5, atol=1e-6, equal_nan=True)


def test_linear_gelu_plain_form_outside_cpu_training():
    x, weight = torch.randn(3, 8), torch.randn(16, 8, requires_grad=True)
    with torch.no_grad():
        assert not linear_gelu_kernel_applies(x, weight)
    assert not linear_gelu_kernel_applies(x.double(), weight.double())
    assert not linear_gelu_kernel_applies(x, weight.detach())
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert not linear_gelu_kernel_applies(x, weight)


@pytest.mark.parametrize('channels', [24, 13])  # a multiple of the 8 lanes, and a tail
@pytest.mark.parametrize('drop', [False, True])
@pytest.mark.parametrize('frozen_gamma', [False, True])
def test_linear_scaled_residual_equals_autograd_of_the_plain_form(channels, drop, frozen_gamma):
    gen = torch.Generator().manual_seed(channels)
    x = torch.randn(4, 3, 5, channels, generator=gen).requires_grad_()
    features = torch.randn(4, 3, 5, 10, generator=gen).requires_grad_()
    weight = torch.randn(channels, 10, generator=gen).requires_grad_()
    bias = torch.randn(channels, generator=gen).requires_grad_()
    gamma = torch.rand(channels, generator=gen).requires_grad_(not frozen_gamma)
    scales = torch.tensor([2.0, 0.0, 2.0, 2.0]) if drop else None
    grad = torch.randn(4, 3, 5, channels, generator=gen)
    params = [t for t in (x, features, weight, bias, gamma) if t.requires_grad]
    assert linear_residual_kernel_applies(x, features, weight, bias, gamma)
    out = linear_scaled_residual(x, features, weight, bias, gamma, scales)
    branch = gamma * F.linear(features, weight, bias)
    expected = x + (branch * scales.view(-1, 1, 1, 1) if drop else branch)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for got, want in zip(torch.autograd.grad(out, params, grad), torch.autograd.grad(expected, params, grad)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_drop_path_scales_draw_as_mmcv():
    from mmcv.cnn.bricks.drop import drop_path
    ones = torch.ones(64, 1, 1)
    torch.manual_seed(3)
    expected = drop_path(ones, 0.3, training=True).flatten()
    torch.manual_seed(3)
    torch.testing.assert_close(drop_path_scales(64, 0.3, ones), expected)
    assert 0 < int((expected == 0).sum()) < 64
