"""The depthwise 'same' convolution: the compiled weight gradient against autograd of ``F.conv2d``."""
import pytest
import torch
import torch.nn.functional as F

from polaformerpp.ops import available_backends
from polaformerpp.ops.depthwise import depthwise_conv2d

needs_kernels = pytest.mark.skipif('cpu' not in available_backends(), reason='fused CPU kernels not built')


def conv_inputs(B, C, H, W, k, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    image = torch.randn(B, C, H, W, generator=g).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(C, 1, k, k, generator=g) * 0.2
    b = torch.randn(C, generator=g) if bias else None
    return image, weight, b


def gradients(fn, image, weight, bias, grad):
    leaves = [t.clone().requires_grad_(True) if t is not None else None for t in (image, weight, bias)]
    out = fn(*leaves)
    out.backward(grad)
    return out, [t.grad if t is not None else None for t in leaves]


def plain(image, weight, bias):
    k = weight.shape[-1]
    return F.conv2d(image, weight, bias, 1, k // 2, 1, image.shape[1])


@needs_kernels
@pytest.mark.parametrize('B,C,H,W,k,bias', [(2, 64, 9, 13, 5, True), (1, 32, 4, 3, 5, False),
                                            (3, 16, 7, 7, 3, True), (2, 48, 1, 6, 3, True), (2, 16, 1, 1, 5, True)])
def test_kernel_gradients_match_autograd_of_conv2d(B, C, H, W, k, bias):
    """Maps smaller than the kernel, rows shorter than the four-pixel unroll, no bias; 1 x 1 maps,
    whose gradient and image are both channels-last with different pixel strides."""
    image, weight, b = conv_inputs(B, C, H, W, k, seed=C + H, bias=bias)
    grad = torch.randn(B, C, H, W, generator=torch.Generator().manual_seed(1))
    out, grads = gradients(depthwise_conv2d, image, weight, b, grad)
    assert out.grad_fn.name() == '_DepthwiseConvCPUBackward'
    ref_out, ref_grads = gradients(plain, image, weight, b, grad)
    torch.testing.assert_close(out, ref_out)
    for mine, ref in zip(grads, ref_grads):
        if ref is None:
            assert mine is None
        else:
            torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-4)


@needs_kernels
def test_weight_only_and_strided_grad():
    """A frozen image (only the weight learns) and an output gradient in another memory format."""
    image, weight, b = conv_inputs(2, 32, 6, 5, 5)
    weight.requires_grad_(True)
    out = depthwise_conv2d(image, weight, b)
    grad = torch.randn(out.shape)  # NCHW-contiguous, not channels-last
    (out * grad).sum().backward()
    reference = weight.detach().clone().requires_grad_(True)
    (plain(image, reference, b) * grad).sum().backward()
    torch.testing.assert_close(weight.grad, reference.grad, rtol=1e-5, atol=1e-4)


def test_other_inputs_take_conv2d():
    """Channels not a multiple of 8, NCHW images, float64 and inference: plain conv2d."""
    odd_channels = conv_inputs(1, 12, 5, 5, 3)
    image, weight, b = conv_inputs(1, 16, 5, 5, 3)
    for args in (odd_channels, (image.contiguous(), weight, b), tuple(t.double() for t in (image, weight, b))):
        leaves = [t.clone().requires_grad_(True) for t in args]
        out = depthwise_conv2d(*leaves)
        assert out.grad_fn.name() != '_DepthwiseConvCPUBackward'
        torch.testing.assert_close(out, plain(*args))
    with torch.no_grad():
        image, weight, b = conv_inputs(1, 16, 5, 5, 3)
        assert depthwise_conv2d(image, weight.requires_grad_(True), b).grad_fn is None


def test_weight_gradient_keeps_the_weight_strides():
    """Autograd's conv backward returns a channels-last image's weight gradient with channels-last strides
    (the same memory order); the gradient comes back in the weight's own strides, as DDP's buckets expect
    ("Grad strides do not match bucket view strides"), on the kernel path and on the plain one."""
    for channels in (16, 12):  # the kernel's weight gradient where built; channels not a multiple of 8: plain
        image, weight, b = conv_inputs(2, channels, 6, 5, 3)
        for dtype in (torch.float32, torch.float64):  # float64: the plain path everywhere
            leaves = [t.detach().to(dtype).requires_grad_(True) for t in (image, weight, b)]
            depthwise_conv2d(*leaves).sum().backward()
            assert leaves[1].grad.stride() == leaves[1].stride() == (9, 9, 3, 1), (channels, dtype)
            reference = [t.detach().to(dtype).requires_grad_(True) for t in (image, weight, b)]
            plain(*reference).sum().backward()
            torch.testing.assert_close(leaves[1].grad, reference[1].grad)
