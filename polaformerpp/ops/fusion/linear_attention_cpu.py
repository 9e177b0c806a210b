"""Training of the linear-attention token mixer on the CPU as one autograd Function.

:class:`PolaLinearAttentionCPU` runs, from the packed ``in_proj`` output
``[q | k | v | gate]``, the LePE convolution, the attention on the fused CPU
kernels and the gated epilogue, ``(attention + LePE) * gate``, and in its
backward writes the gradients of q, k, v and the gate into one packed
``(B, H, W, 4C)`` tensor: the attention's row kernels write ``dq`` and ``dk``
straight into their slices, ``dv`` and the LePE's input gradient land in the
``v`` slice, ``dgate`` in its own. Under plain autograd the same step makes
four separate gradients and concatenates them (a pass over ``4C`` channels),
sums the two ``v`` gradients and runs the epilogue's products as separate
passes.

It serves what :func:`fused_training_applies` accepts (CPU fp32 training on
the compiled kernels, inputs in the shift-free exponent range) in
:class:`~.modules.FusedPolaLinearAttention`; the plain module is the
reference its tests hold it to.
"""
from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..depthwise import depthwise_conv2d, depthwise_conv2d_backward
from ..pola_attention import cpu_kernels_apply, pola_attention_cpu_backward, pola_attention_cpu_with_state
from ..rope import RopeHalves

__all__ = ['PolaLinearAttentionCPU', 'fused_training_applies', 'DEFAULT_EPS']

#: the attention's denominator epsilon (the op's default)
DEFAULT_EPS = 1e-6


def fused_training_applies(x: Tensor, backend: str) -> bool:
    """Whether a training step on ``x`` ``(B, H, W, C)`` may run :class:`PolaLinearAttentionCPU`.

    CPU fp32 under autograd, backend ``'auto'`` or ``'cpu'`` with the kernels
    built, not traced or compiled, no autocast.
    """
    return torch.is_grad_enabled() and backend in ('auto', 'cpu') and cpu_kernels_apply(x)


def _heads(tokens: Tensor, heads: int) -> Tensor:
    """``(B, N, C)`` (last dim contiguous, any token stride) -> ``(B, h, N, C / h)`` view."""
    B, N, C = tokens.shape
    return tokens.view(B, N, heads, C // heads).transpose(1, 2)


class PolaLinearAttentionCPU(torch.autograd.Function):
    """``((pola_attention(q, k, v) merged) + lepe(v)) * gate`` from the packed projection.

    Forward args:
        proj: ``(B, H, W, 4C)`` contiguous, ``[q | k | v | gate]``.
        temp_same, temp_opp: ``(h, 2d)`` temperatures (after the sigmoid).
        lepe_weight, lepe_bias: the depthwise LePE conv's ``(C, 1, kh, kw)`` and ``(C,)``.
        heads: h. rope: :class:`~polaformerpp.ops.rope.RopeHalves` or None. eps: as the op.

    Returns:
        Tensor: ``(B, N, C)``, what the output projection reads.
    """

    @staticmethod
    def forward(ctx, proj, temp_same, temp_opp, lepe_weight, lepe_bias, heads: int,
                rope: Optional[RopeHalves], eps: float):
        B, H, W, C4 = proj.shape
        C, N = C4 // 4, H * W
        tokens = proj.view(B, N, C4)
        v = tokens[..., 2 * C:3 * C].contiguous()
        lepe = depthwise_conv2d(v.view(B, H, W, C).permute(0, 3, 1, 2), lepe_weight, lepe_bias)  # no grad here
        attn, state, key_mean, _ = pola_attention_cpu_with_state(
            _heads(tokens[..., :C], heads), _heads(tokens[..., C:2 * C], heads), _heads(v, heads), temp_same,
            temp_opp, rope, eps, shifted=False)
        pre_gate = lepe.permute(0, 2, 3, 1).reshape(B, N, C)  # the conv's fresh channels-last output: a view
        pre_gate.view(B, N, heads, -1).add_(attn.transpose(1, 2))
        ctx.heads, ctx.rope, ctx.eps = heads, rope, eps
        ctx.save_for_backward(proj, v, temp_same, temp_opp, lepe_weight, attn, state, key_mean, pre_gate)
        return pre_gate * tokens[..., 3 * C:]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        proj, v, temp_same, temp_opp, lepe_weight, attn, state, key_mean, pre_gate = ctx.saved_tensors
        heads = ctx.heads
        B, H, W, C4 = proj.shape
        C, N = C4 // 4, H * W
        tokens = proj.view(B, N, C4)
        grad = grad.contiguous()
        grad_pre_gate = grad * tokens[..., 3 * C:]  # d(attention) = d(lepe)
        grad_proj = torch.empty(B, N, C4, dtype=proj.dtype)
        torch.mul(grad, pre_gate, out=grad_proj[..., 3 * C:])
        grad_qkv = tuple(_heads(grad_proj[..., i * C:(i + 1) * C], heads) for i in range(3))
        *_, grad_same, grad_opp = pola_attention_cpu_backward(
            _heads(grad_pre_gate, heads), _heads(tokens[..., :C], heads), _heads(tokens[..., C:2 * C], heads),
            _heads(v, heads), temp_same, temp_opp, attn, state, key_mean, ctx.rope, ctx.eps, grad_qkv=grad_qkv)
        # the LePE conv: its input gradient joins dv
        grad_v_image, grad_weight, grad_bias = depthwise_conv2d_backward(
            grad_pre_gate.view(B, H, W, C).permute(0, 3, 1, 2), v.view(B, H, W, C).permute(0, 3, 1, 2), lepe_weight)
        grad_proj[..., 2 * C:3 * C].view(B, H, W, C).add_(grad_v_image.permute(0, 2, 3, 1))
        return grad_proj.view(B, H, W, C4), grad_same, grad_opp, grad_weight, grad_bias, None, None, None
