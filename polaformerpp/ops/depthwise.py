"""Depthwise 'same' convolution (stride 1, zero padding) with a fast CPU weight gradient.

:func:`depthwise_conv2d` is ``F.conv2d(image, weight, bias, padding=k // 2,
groups=C)``. On the CPU under autograd (fp32, channels-last image, channels a
multiple of 8) its backward takes the input gradient from oneDNN, as autograd
would, and the weight and bias gradients from the compiled kernel
``depthwise_conv_weight_grad``: for the backbone's 5x5 LePE and its large 3x3
maps oneDNN's weight gradient is a slow path, several times the whole forward.
Under ``torch.compile`` / ``torch.export`` the same form is the custom op
``torch.ops.polaformerpp.depthwise_conv2d`` (a fake kernel and a registered
backward, ``torch.ops.polaformerpp.depthwise_conv2d_backward``), so a compiled
training step keeps the kernel. Everywhere else (inference, other devices
and dtypes, ``torch.jit.trace``) it is the plain ``F.conv2d``, which the
tests hold the kernel to.

Either way a weight gradient has the weight's own strides. For a channels-last
image, autograd's convolution backward returns the ``(C, 1, kh, kw)`` gradient
in channels-last strides (``(kh*kw, 1, kw, 1)`` against the weight's
``(kh*kw, kh*kw, kw, 1)``): the same memory order, which ``AccumulateGrad``
keeps as ``.grad``, and which DDP then reports ("Grad strides do not match
bucket view strides"). The gradient is re-strided, a view, not a copy.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from .library import cpu_kernels_apply, custom_ops_apply, kernels, kernels_available, register_kernel_op
from .tracing import is_tracing

__all__ = ['depthwise_conv2d', 'depthwise_conv2d_backward']


def depthwise_conv2d(image: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """A depthwise conv with 'same' output size.

    Args:
        image: ``(B, C, H, W)``.
        weight: ``(C, 1, kh, kw)``, odd ``kh`` and ``kw`` (padding ``kh // 2``, ``kw // 2``).
        bias: ``(C,)`` or None.

    Returns:
        Tensor: ``(B, C, H, W)``, in the image's memory format.
    """
    if _kernel_backward_applies(image, weight, bias):
        return _DepthwiseConvCPU.apply(image, weight, bias)
    if _custom_op_applies(image, weight, bias):
        return torch.ops.polaformerpp.depthwise_conv2d(image, weight, bias)
    if torch.is_grad_enabled() and weight.requires_grad and not is_tracing():
        weight = _GradInWeightLayout.apply(weight)
    return _same_conv(image, weight, bias)


def _in_layout_of(grad: Tensor, weight: Tensor) -> Tensor:
    """``grad`` with ``weight``'s strides where both are dense in the same memory order (a view)."""
    if grad is None or grad.stride() == weight.stride() or not (grad.is_contiguous() and weight.is_contiguous()):
        return grad
    return grad.reshape(-1).view(weight.shape)


class _GradInWeightLayout(torch.autograd.Function):
    """The identity on a weight; its gradient comes back in the weight's strides."""

    @staticmethod
    def forward(ctx, weight):
        ctx.save_for_backward(weight)
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad):
        return _in_layout_of(grad, *ctx.saved_tensors)


def depthwise_conv2d_backward(grad: Tensor, image: Tensor, weight: Tensor, input_grad: bool = True,
                              weight_grad: bool = True) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """The gradients ``(image, weight, bias)`` of :func:`depthwise_conv2d` (None where not asked).

    The image's from oneDNN; the weight's and the bias's from the compiled kernel where the
    channels are innermost in both tensors and a multiple of 8, from oneDNN otherwise.
    """
    channels, (kh, kw) = image.shape[1], weight.shape[-2:]
    args = ([1, 1], [kh // 2, kw // 2], [1, 1], False, [0, 0], channels)
    grad_image = grad_weight = grad_bias = None
    if input_grad:
        grad_image = torch.ops.aten.convolution_backward(grad, image, weight, None, *args, [True, False, False])[0]
    if weight_grad:
        if kernels is not None and channels % 8 == 0 and grad.stride(1) == 1 and image.stride(1) == 1:
            grad_weight, grad_bias = kernels.depthwise_conv_weight_grad(grad, image, kh, kw)
        else:
            _, grad_weight, grad_bias = torch.ops.aten.convolution_backward(grad, image, weight, [channels], *args,
                                                                            [False, True, True])
        grad_weight = _in_layout_of(grad_weight, weight)
    return grad_image, grad_weight, grad_bias


def _same_conv(image: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    kh, kw = weight.shape[-2:]
    return F.conv2d(image, weight, bias, 1, (kh // 2, kw // 2), 1, image.shape[1])


def _kernel_backward_applies(image: Tensor, weight: Tensor, bias: Optional[Tensor]) -> bool:
    tensors = [t for t in (image, weight, bias) if t is not None]
    if not torch.is_grad_enabled() or not any(t.requires_grad for t in tensors) or not cpu_kernels_apply(*tensors):
        return False
    return _kernel_shapes(image, weight)


def _custom_op_applies(image: Tensor, weight: Tensor, bias: Optional[Tensor]) -> bool:
    """Under torch.compile / torch.export: fp32 CPU tensors of which one records gradients, kernels built."""
    tensors = [t for t in (image, weight, bias) if t is not None]
    return (OPS_REGISTERED and custom_ops_apply(*tensors) and torch.is_grad_enabled()
            and any(t.requires_grad for t in tensors) and _kernel_shapes(image, weight))


def _kernel_shapes(image: Tensor, weight: Tensor) -> bool:
    """A channels-last image with channels a multiple of 8, a depthwise kernel of odd sides."""
    channels = image.shape[1]
    kh, kw = weight.shape[-2:]
    return (image.dim() == 4 and image.stride(1) == 1 and channels % 8 == 0 and kh % 2 == 1 and kw % 2 == 1
            and tuple(weight.shape[:2]) == (channels, 1))


class _DepthwiseConvCPU(torch.autograd.Function):
    """``F.conv2d`` forward; input gradient from oneDNN, weight and bias gradients from the kernel."""

    @staticmethod
    def forward(ctx, image, weight, bias):
        ctx.save_for_backward(image, weight)
        ctx.has_bias = bias is not None
        return _same_conv(image, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        image, weight = ctx.saved_tensors
        grad_image, grad_weight, grad_bias = depthwise_conv2d_backward(
            grad.contiguous(memory_format=torch.channels_last), image, weight, ctx.needs_input_grad[0],
            ctx.needs_input_grad[1] or ctx.needs_input_grad[2])
        return grad_image, grad_weight, grad_bias if ctx.has_bias else None


def _channels_last_like(image: Tensor, out: Tensor) -> Tensor:
    """``out`` in ``image``'s memory format (channels-last or contiguous), as the custom ops promise."""
    channels_last = image.is_contiguous(memory_format=torch.channels_last) and not image.is_contiguous()
    return out.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def _op_forward(image: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    return _channels_last_like(image, _same_conv(image, weight, bias))


def _op_forward_fake(image, weight, bias):
    return _channels_last_like(image, torch.empty_like(image, memory_format=torch.contiguous_format))


def _op_backward(grad: Tensor, image: Tensor, weight: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    grad = grad.contiguous(memory_format=torch.channels_last)
    grad_image, grad_weight, grad_bias = depthwise_conv2d_backward(grad, image, weight)
    return _channels_last_like(image, grad_image), grad_weight.contiguous(), grad_bias.contiguous()


def _op_backward_fake(grad, image, weight):
    return (_channels_last_like(image, torch.empty_like(image, memory_format=torch.contiguous_format)),
            torch.empty_like(weight, memory_format=torch.contiguous_format), weight.new_empty(weight.shape[0]))


def _setup_context(ctx, inputs, output):
    image, weight, bias = inputs
    ctx.save_for_backward(image, weight)
    ctx.has_bias = bias is not None


def _backward(ctx, grad):
    image, weight = ctx.saved_tensors
    grad_image, grad_weight, grad_bias = torch.ops.polaformerpp.depthwise_conv2d_backward(grad, image, weight)
    return grad_image, grad_weight, grad_bias if ctx.has_bias else None


#: whether ``torch.ops.polaformerpp.depthwise_conv2d`` (and its backward) exist in this process
OPS_REGISTERED = kernels_available()
if OPS_REGISTERED:
    register_kernel_op('depthwise_conv2d', _op_forward, _op_forward_fake, _op_backward, _op_backward_fake,
                       _backward, _setup_context)
