"""Depthwise 'same' convolution (stride 1, zero padding) with a fast CPU weight gradient.

:func:`depthwise_conv2d` is ``F.conv2d(image, weight, bias, padding=k // 2,
groups=C)``. On the CPU under autograd (fp32, channels-last image, channels a
multiple of 8) its backward takes the input gradient from oneDNN, as autograd
would, and the weight and bias gradients from the compiled kernel
``depthwise_conv_weight_grad``: for the backbone's 5x5 LePE and its large 3x3
maps oneDNN's weight gradient is a slow path, several times the whole forward.
Everywhere else (inference, other devices and dtypes, tracing) it is the plain
``F.conv2d``, which the tests hold the kernel to.

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

from .library import cpu_kernels_apply, kernels
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
        ctx.weight_strides = weight.stride()
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad):
        if grad.stride() == ctx.weight_strides or not grad.is_contiguous():
            return grad
        return grad.reshape(-1).view(grad.shape)


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
