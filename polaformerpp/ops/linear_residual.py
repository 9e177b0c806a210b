"""``x + drop_path(gamma * linear(features))`` with the bias, layer scale and residual in one compiled pass.

:func:`linear_scaled_residual` is a block's residual branch after its output
product. On the CPU under autograd (fp32) the product runs without its bias
(torch's ``addmm`` first copies the bias into every output row) and the
compiled kernel ``scaled_residual`` forms ``x + s_b gamma (h + bias)`` in one
pass; the backward's kernel ``scaled_residual_backward`` forms the product's
gradient and sums the bias and layer-scale gradients in the same pass, where
autograd takes two products, a broadcast sum and the bias sum. Where nothing
records gradients the kernel writes in place into the product's fresh output.
``s_b`` is the stochastic-depth scale of sample ``b``, drawn as mmcv's
``DropPath`` draws it (same random numbers). Under ``torch.compile`` /
``torch.export`` the same form is the product and the custom op
``torch.ops.polaformerpp.scaled_residual`` (a fake kernel and a registered
backward, ``torch.ops.polaformerpp.scaled_residual_backward``), so compiled
training and inference keep the kernels (:func:`eager_decompositions` gives its
plain form for formats without the op). Everywhere else (other devices and
dtypes, ``torch.jit.trace``, autocast) it is the plain form, which the tests
hold the kernels to.
"""
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from .library import cpu_kernels_apply, custom_ops_apply, kernels, kernels_available, register_kernel_op

__all__ = ['linear_scaled_residual', 'linear_residual_kernel_applies', 'drop_path_scales', 'eager_decompositions']


def drop_path_scales(batch: int, drop_prob: float, like: Tensor) -> Tensor:
    """Per-sample stochastic-depth scales ``(batch,)``: 0 (dropped) or ``1 / (1 - drop_prob)``.

    The same draw as mmcv's ``drop_path`` (one ``torch.rand`` value per sample,
    kept where ``keep_prob + rand >= 1``).
    """
    keep_prob = 1.0 - drop_prob
    return (keep_prob + torch.rand(batch, dtype=like.dtype, device=like.device)).floor_().div_(keep_prob)


def linear_scaled_residual(x: Tensor, features: Tensor, weight: Tensor, bias: Tensor, gamma: Tensor,
                           sample_scale: Optional[Tensor] = None) -> Tensor:
    """``x + s * gamma * F.linear(features, weight, bias)``, ``s`` broadcast per sample.

    Args:
        x: ``(B, ..., C)``, the residual stream.
        features: ``(B, ..., C_in)`` with the token count of ``x``.
        weight: ``(C, C_in)``. bias, gamma: ``(C,)``.
        sample_scale: ``(B,)`` (:func:`drop_path_scales`) or None (all ones).

    Returns:
        Tensor: shaped like ``x``.
    """
    if linear_residual_kernel_applies(x, features, weight, bias, gamma):
        if torch.compiler.is_compiling():
            h = torch.mm(features.reshape(-1, features.shape[-1]), weight.t())
            out = torch.ops.polaformerpp.scaled_residual(x.reshape(-1, x.shape[-1]), h, bias, gamma, sample_scale,
                                                         h.shape[0] // x.shape[0])
            return out.view(x.shape)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (x, features, weight, bias, gamma)):
            return _LinearScaledResidualCPU.apply(x, features, weight, bias, gamma, sample_scale)
        h = torch.mm(features.reshape(-1, features.shape[-1]), weight.t())
        kernels.scaled_residual(x.reshape(-1, x.shape[-1]), h, bias.contiguous(), gamma.contiguous(), sample_scale,
                                h.shape[0] // x.shape[0], out=h)
        return h.view(x.shape)
    branch = gamma * F.linear(features, weight, bias)
    if sample_scale is not None:
        branch = branch * sample_scale.view(-1, *([1] * (branch.dim() - 1)))
    return x + branch


def linear_residual_kernel_applies(x: Tensor, features: Tensor, weight: Tensor, bias: Optional[Tensor],
                                   gamma: Tensor) -> bool:
    """CPU fp32 tensors, a bias, the kernels built, no autocast, not ``torch.jit.trace``d (under
    torch.compile / torch.export: the custom op)."""
    tensors = (x, features, weight, bias, gamma)
    if bias is None or not (cpu_kernels_apply(*tensors) or (OPS_REGISTERED and custom_ops_apply(*tensors))):
        return False
    return (hasattr(kernels, 'scaled_residual') and x.shape[-1] == weight.shape[0] == bias.shape[-1] == gamma.shape[-1]
            and features.shape[-1] == weight.shape[1] and x.shape[:-1] == features.shape[:-1])


class _LinearScaledResidualCPU(torch.autograd.Function):
    """The product by ``torch.mm`` without bias; bias, layer scale and residual (and gradients) by the kernels."""

    @staticmethod
    def forward(ctx, x, features, weight, bias, gamma, sample_scale):
        rows = features.reshape(-1, features.shape[-1])
        h = torch.mm(rows, weight.t())
        per_sample = rows.shape[0] // x.shape[0]
        out = kernels.scaled_residual(x.reshape(-1, x.shape[-1]), h, bias.contiguous(), gamma.contiguous(),
                                      sample_scale, per_sample)
        ctx.save_for_backward(rows, weight, bias, gamma, h, sample_scale)
        ctx.shapes = (x.shape, features.shape)
        return out.view(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        rows, weight, bias, gamma, h, sample_scale = ctx.saved_tensors
        x_shape, features_shape = ctx.shapes
        grad_rows = grad.reshape(h.shape).contiguous()
        grad_h, grad_bias, grad_gamma = kernels.scaled_residual_backward(
            grad_rows, h, bias.contiguous(), gamma.contiguous(), sample_scale, h.shape[0] // x_shape[0])
        needs = ctx.needs_input_grad
        grad_features = torch.mm(grad_h, weight).view(features_shape) if needs[1] else None
        grad_weight = torch.mm(grad_h.t(), rows) if needs[2] else None
        return (grad if needs[0] else None, grad_features, grad_weight, grad_bias if needs[3] else None,
                grad_gamma if needs[4] else None, None)


def _op_scaled_residual(x: Tensor, h: Tensor, bias: Tensor, gamma: Tensor, sample_scale: Optional[Tensor],
                        rows_per_sample: int) -> Tensor:
    return kernels.scaled_residual(x.contiguous(), h.contiguous(), bias.contiguous(), gamma.contiguous(),
                                   None if sample_scale is None else sample_scale.contiguous(), rows_per_sample)


def _op_scaled_residual_fake(x, h, bias, gamma, sample_scale, rows_per_sample):
    return h.new_empty(h.shape)


def _op_scaled_residual_backward(grad: Tensor, h: Tensor, bias: Tensor, gamma: Tensor,
                                 sample_scale: Optional[Tensor], rows_per_sample: int) -> Tuple[Tensor, Tensor, Tensor]:
    """``(dh, dbias, dgamma)``."""
    return kernels.scaled_residual_backward(grad.contiguous(), h.contiguous(), bias.contiguous(), gamma.contiguous(),
                                            None if sample_scale is None else sample_scale.contiguous(),
                                            rows_per_sample)


def _op_scaled_residual_backward_fake(grad, h, bias, gamma, sample_scale, rows_per_sample):
    return h.new_empty(h.shape), bias.new_empty(bias.shape), gamma.new_empty(gamma.shape)


def _setup_context(ctx, inputs, output):
    x, h, bias, gamma, sample_scale, rows_per_sample = inputs
    ctx.save_for_backward(h, bias, gamma, sample_scale)
    ctx.rows_per_sample = rows_per_sample


def _backward(ctx, grad):
    h, bias, gamma, sample_scale = ctx.saved_tensors
    grad_h, grad_bias, grad_gamma = torch.ops.polaformerpp.scaled_residual_backward(grad, h, bias, gamma,
                                                                                  sample_scale, ctx.rows_per_sample)
    return grad, grad_h, grad_bias, grad_gamma, None, None


def _eager_scaled_residual(x, h, bias, gamma, sample_scale, rows_per_sample):
    branch = gamma * (h + bias)
    if sample_scale is not None:
        branch = (branch.view(-1, rows_per_sample, branch.shape[-1]) * sample_scale.view(-1, 1, 1)).view(h.shape)
    return x + branch


def eager_decompositions() -> Dict[object, Callable]:
    """``{custom op: its eager torch form}`` (for ``ExportedProgram.run_decompositions``); empty where the
    op is not registered."""
    return {torch.ops.polaformerpp.scaled_residual.default: _eager_scaled_residual} if OPS_REGISTERED else {}


#: whether ``torch.ops.polaformerpp.scaled_residual`` (and its backward) exist in this process
OPS_REGISTERED = kernels_available()
if OPS_REGISTERED:
    register_kernel_op('scaled_residual', _op_scaled_residual, _op_scaled_residual_fake, _op_scaled_residual_backward,
                       _op_scaled_residual_backward_fake, _backward, _setup_context)
