"""``gelu(linear(x))`` (exact erf GELU) with its bias and activation in one compiled pass, for CPU training.

:func:`linear_gelu` is ``F.gelu(F.linear(x, weight, bias))``. On the CPU under
autograd (fp32) the product runs without its bias (torch's ``addmm`` first
copies the bias into every output row) and the compiled kernel ``bias_gelu``
adds the bias and applies the GELU in one pass; the backward's kernel
``bias_gelu_backward`` forms ``dy * gelu'(h + b)`` and sums the bias gradient in
the same pass, where autograd takes a GELU-gradient pass and a separate column
sum. Under ``torch.compile`` / ``torch.export`` the same form is the product
and the custom op ``torch.ops.polaformerpp.bias_gelu`` (a fake kernel and a
registered backward, ``torch.ops.polaformerpp.bias_gelu_backward``), so a
compiled training step keeps the kernels. Everywhere else (inference, other
devices and dtypes, ``torch.jit.trace``, autocast) it is the plain form, which
the tests hold the kernels to.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from .library import cpu_kernels_apply, custom_ops_apply, kernels, kernels_available, register_kernel_op

__all__ = ['linear_gelu', 'linear_gelu_kernel_applies']


def linear_gelu(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``F.gelu(F.linear(x, weight, bias))``.

    Args:
        x: ``(..., C_in)``.
        weight: ``(C_out, C_in)``. bias: ``(C_out,)`` or None.

    Returns:
        Tensor: ``(..., C_out)``.
    """
    if linear_gelu_kernel_applies(x, weight, bias):
        if torch.compiler.is_compiling():
            h = torch.mm(x.reshape(-1, x.shape[-1]), weight.t())
            return torch.ops.polaformerpp.bias_gelu(h, bias).view(*x.shape[:-1], weight.shape[0])
        return _LinearGELUCPU.apply(x, weight, bias)
    return F.gelu(F.linear(x, weight, bias))


def linear_gelu_kernel_applies(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> bool:
    """CPU fp32 tensors of which one records gradients, kernels built, no autocast, not ``torch.jit.trace``d
    (under torch.compile / torch.export: the custom op)."""
    tensors = [t for t in (x, weight, bias) if t is not None]
    if not torch.is_grad_enabled() or not any(t.requires_grad for t in tensors):
        return False
    if not (cpu_kernels_apply(*tensors) or (OPS_REGISTERED and custom_ops_apply(*tensors))):
        return False
    return (hasattr(kernels, 'bias_gelu') and weight.dim() == 2 and x.shape[-1] == weight.shape[1]
            and (bias is None or tuple(bias.shape) == (weight.shape[0], )))


class _LinearGELUCPU(torch.autograd.Function):
    """The product by ``torch.mm`` without bias; bias and GELU (and their gradients) by the kernels."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        rows = x.reshape(-1, x.shape[-1])
        h = torch.mm(rows, weight.t())
        y = kernels.bias_gelu(h, None if bias is None else bias.contiguous())
        ctx.save_for_backward(rows, weight, bias, h)
        ctx.input_shape = x.shape
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        rows, weight, bias, h = ctx.saved_tensors
        grad_h, grad_bias = kernels.bias_gelu_backward(
            grad.reshape(h.shape).contiguous(), h, None if bias is None else bias.contiguous(),
            bias is not None and ctx.needs_input_grad[2])
        grad_x = torch.mm(grad_h, weight).view(ctx.input_shape) if ctx.needs_input_grad[0] else None
        grad_weight = torch.mm(grad_h.t(), rows) if ctx.needs_input_grad[1] else None
        return grad_x, grad_weight, grad_bias


def _op_bias_gelu(h: Tensor, bias: Optional[Tensor]) -> Tensor:
    return kernels.bias_gelu(h.contiguous(), None if bias is None else bias.contiguous())


def _op_bias_gelu_fake(h, bias):
    return h.new_empty(h.shape)


def _op_bias_gelu_backward(grad: Tensor, h: Tensor, bias: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """``(dh, dbias)``; ``dbias`` is empty ``(0,)`` without a bias."""
    grad_h, grad_bias = kernels.bias_gelu_backward(grad.contiguous(), h.contiguous(),
                                                   None if bias is None else bias.contiguous(), bias is not None)
    return grad_h, grad_bias if grad_bias is not None else h.new_empty(0)


def _op_bias_gelu_backward_fake(grad, h, bias):
    return h.new_empty(h.shape), h.new_empty(h.shape[1] if bias is not None else 0)


def _setup_context(ctx, inputs, output):
    h, bias = inputs
    ctx.save_for_backward(h, bias)


def _backward(ctx, grad):
    h, bias = ctx.saved_tensors
    grad_h, grad_bias = torch.ops.polaformerpp.bias_gelu_backward(grad, h, bias)
    return grad_h, grad_bias if bias is not None else None


#: whether ``torch.ops.polaformerpp.bias_gelu`` (and its backward) exist in this process
OPS_REGISTERED = kernels_available()
if OPS_REGISTERED:
    register_kernel_op('bias_gelu', _op_bias_gelu, _op_bias_gelu_fake, _op_bias_gelu_backward,
                       _op_bias_gelu_backward_fake, _backward, _setup_context)
