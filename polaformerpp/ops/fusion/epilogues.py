"""Fused CPU forms of layer patterns (oneDNN post-ops, BatchNorm folding), for the fused modules.

In inference on the CPU (fp32, nothing recording gradients, no autocast, not
traced) a pass over the activations costs about as much as the matrix product
that produced them, and every fresh activation tensor pays its page faults.
These helpers keep such passes inside the producing kernel:

* :func:`linear_act`: ``act(linear(x))`` (``act`` may be None) as one oneDNN
  matmul with the bias and the activation in its epilogue, where the output is
  large enough for the saved pass to pay (and, in CPU training with an exact
  GELU, :func:`~polaformerpp.ops.linear_gelu.linear_gelu`: bias, GELU and
  their gradients in one compiled pass each);
* :func:`conv_bn_act`: ``act(bn(conv(x)))`` as one oneDNN convolution, the
  BatchNorm folded into the conv's weight and bias (eval mode);
* :func:`layer_norm_to_nchw`: a channels-last LayerNorm whose output is
  transposed to NCHW block by block while in cache;
* :func:`inference_fusable`: whether a call may take those forms;
* :func:`has_module_hooks`: whether hooks watch a module, which then keeps
  its plain call (the fused forms do not call the modules they fold).

Each takes the modules it fuses and the input; none is used by the network
definition itself (:mod:`polaformerpp.models`), only by the fused modules of
:mod:`.modules`.

Everywhere else (training, autograd, other devices and dtypes, torch.compile,
ONNX export and tracing) they compute the plain module sequence, which stays
the reference the fused forms are tested against.
"""
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..linear_gelu import linear_gelu, linear_gelu_kernel_applies
from ..tracing import is_tracing

__all__ = ['inference_fusable', 'has_module_hooks', 'linear_act', 'linear_output_bytes', 'conv_bn_act',
           'fold_batch_norm', 'layer_norm_to_nchw']

#: outputs from this size on take the fused matmul. Measured (2 threads, fp32): where the output
#: is large, the pass the activation saves over a fresh tensor dominates and the fused form is
#: 1.2-1.5x faster; below, MKL's sgemm plus a separate activation is faster than oneDNN's matmul
#: (0.7-0.9x fused at 5-14 MiB outputs of 256-512 input channels).
MIN_FUSED_LINEAR_OUTPUT_BYTES = 16 * 2**20

#: activation modules -> oneDNN post-op names
_POST_OPS = {nn.GELU: 'gelu', nn.SiLU: 'swish', nn.ReLU: 'relu'}


def _mkldnn_pointwise_available() -> bool:
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and hasattr(ops, '_linear_pointwise') and hasattr(
        ops, '_convolution_pointwise')


_AVAILABLE = _mkldnn_pointwise_available()


def inference_fusable(x: Tensor, module: nn.Module) -> bool:
    """Whether ``module`` may run its fused form on ``x``: CPU fp32 inference, oneDNN present.

    False while autograd records (grad mode with a parameter or ``x`` requiring
    grad), under CPU autocast and under torch.compile / tracing / export.
    """
    if not _AVAILABLE or x.device.type != 'cpu' or x.dtype != torch.float32:
        return False
    if torch.is_autocast_enabled('cpu') or is_tracing():
        return False
    if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in module.parameters())):
        return False
    return True


_HOOK_DICTS = ('_forward_hooks', '_forward_pre_hooks', '_backward_hooks', '_backward_pre_hooks')
_GLOBAL_HOOK_DICTS = tuple(f'_global{name}' for name in _HOOK_DICTS)


def has_module_hooks(*modules: nn.Module) -> bool:
    """Whether any of ``modules`` carries forward or backward (pre-)hooks, or global module hooks exist.

    A fused form that folds a module into another pass never calls it, so its
    hooks would not fire: where hooks watch, the modules keep their plain calls.
    """
    registry = torch.nn.modules.module
    if any(getattr(registry, name, None) for name in _GLOBAL_HOOK_DICTS):
        return True
    return any(getattr(m, name, None) for m in modules for name in _HOOK_DICTS)


def _post_op(act: Optional[nn.Module]) -> Optional[str]:
    """oneDNN's name for ``act`` (``'none'`` for no activation); None when it has none."""
    if act is None or isinstance(act, nn.Identity):
        return 'none'
    if isinstance(act, nn.GELU) and act.approximate != 'none':
        return None
    return _POST_OPS.get(type(act))


def _algorithm(post_op: str) -> str:
    """The post-op's algorithm argument: GELU's exact (erf) form, nothing for the others."""
    return 'none' if post_op == 'gelu' else ''


def linear_output_bytes(x: Tensor, linear: nn.Linear) -> int:
    """Bytes of ``linear(x)`` for ``x`` ``(..., C_in)`` (in ``x``'s dtype)."""
    return x.numel() // max(x.shape[-1], 1) * linear.out_features * x.element_size()


def linear_act(linear: nn.Linear, act: Optional[nn.Module], x: Tensor) -> Tensor:
    """``act(linear(x))`` for ``x`` ``(..., C_in)``; one fused matmul where :func:`inference_fusable`
    and the output holds at least :data:`MIN_FUSED_LINEAR_OUTPUT_BYTES`; with an exact GELU
    in CPU training, :func:`~polaformerpp.ops.linear_gelu.linear_gelu`."""
    post_op = _post_op(act)
    if post_op is None or has_module_hooks(linear, *([act] if act is not None else [])):
        y = linear(x)
        return y if act is None else act(y)
    # the size test last: under tracing (export with symbolic sizes) it would become a guard
    if (inference_fusable(x, linear) and x.stride(-1) == 1
            and linear_output_bytes(x, linear) >= MIN_FUSED_LINEAR_OUTPUT_BYTES):
        return torch.ops.mkldnn._linear_pointwise(x, linear.weight, linear.bias, post_op, [],
                                                _algorithm(post_op))
    if post_op == 'gelu' and type(linear) is nn.Linear and linear_gelu_kernel_applies(x, linear.weight, linear.bias):
        return linear_gelu(x, linear.weight, linear.bias)
    y = linear(x)
    return y if act is None else act(y)


def fold_batch_norm(conv: nn.Conv2d, bn: nn.BatchNorm2d):
    """The ``(weight, bias)`` of one conv computing ``bn(conv(x))`` with ``bn``'s running statistics."""
    scale = bn.weight * torch.rsqrt(bn.running_var + bn.eps)
    weight = conv.weight * scale.reshape(-1, 1, 1, 1)
    bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
    return weight, (bias - bn.running_mean) * scale + bn.bias


def conv_bn_act(conv: nn.Conv2d, bn: Optional[nn.BatchNorm2d], act: Optional[nn.Module], x: Tensor) -> Tensor:
    """``act(bn(conv(x)))`` for ``x`` ``(B, C, H, W)``; one fused convolution where :func:`inference_fusable`.

    The fused form folds ``bn`` (in eval mode: its running statistics) into the conv
    and applies ``act`` as oneDNN's post-op; its output keeps ``x``'s memory
    format (channels-last in, channels-last out).
    """
    post_op = _post_op(act)
    fusable = (post_op is not None and inference_fusable(x, conv) and (bn is None or inference_fusable(x, bn))
               and not has_module_hooks(*(m for m in (conv, bn, act) if m is not None))
               and conv.padding_mode == 'zeros' and not isinstance(conv.padding, str)
               and (bn is None or (not bn.training and bn.running_mean is not None and bn.affine)))
    if not fusable:
        y = conv(x)
        if bn is not None:
            y = bn(y)
        return y if act is None else act(y)
    weight, bias = fold_batch_norm(conv, bn) if bn is not None else (conv.weight, conv.bias)
    return torch.ops.mkldnn._convolution_pointwise(x, weight, bias, list(conv.padding), list(conv.stride),
                                                   list(conv.dilation), conv.groups, post_op, [],
                                                   _algorithm(post_op))


#: bytes of tokens per block of :func:`layer_norm_to_nchw` (measured, 2 threads: 1 MiB blocks are
#: 3-4x faster than one whole-map transposing copy at 64-256 channels, 256 KiB ~10% slower)
NCHW_BLOCK_BYTES = 2**20


def layer_norm_to_nchw(norm: nn.LayerNorm, x: Tensor) -> Tensor:
    """``norm(x)`` for channels-last tokens ``x`` ``(B, H, W, C)`` as a contiguous ``(B, C, H, W)`` tensor.

    Where :func:`inference_fusable` (and ``x`` is contiguous) the tokens go in
    blocks of about :data:`NCHW_BLOCK_BYTES`: each block is normalised and
    written transposed while it is in cache. ATen's transposing copy of a
    whole map runs far below memory speed (a 256 x 256 x 64 map: 11.6 ms
    against 2.9 ms in blocks). The values are those of the plain form.
    """
    def normalised(tokens):  # the functional form: ``norm`` may call this from its own forward
        return F.layer_norm(tokens, norm.normalized_shape, norm.weight, norm.bias, norm.eps)

    if not (inference_fusable(x, norm) and x.is_contiguous()):
        return normalised(x).permute(0, 3, 1, 2).contiguous()
    B, H, W, C = x.shape
    out = x.new_empty(B, C, H, W)
    tokens, out_tokens = x.view(B, H * W, C), out.view(B, C, H * W)
    step = max(1, NCHW_BLOCK_BYTES // (C * x.element_size()))
    for start in range(0, H * W, step):
        out_tokens[:, :, start:start + step].copy_(normalised(tokens[:, start:start + step]).transpose(1, 2))
    return out
