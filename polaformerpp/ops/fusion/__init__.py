"""The one place where the network's fast paths are chosen: :func:`fuse_modules`.

The network definition (:mod:`polaformerpp.models`) is plain PyTorch modules.
Their fused forms live here, one class per plain module
(:data:`FUSED_FORMS`), each a subclass with the same parameters and no state
of its own, so that turning a built network into its fused form changes
neither its module tree nor its parameter names and checkpoint keys (as
mmcv's ``fuse_conv_bn`` or mmpretrain's ``switch_to_deploy`` rewrite a built
model, but reversibly and for training too). The backbone does it at build
time unless ``fused=False``.

A fused module takes its fused form where its inputs allow it (CPU fp32, no
autocast, not traced; some forms only in inference, some only under
autograd; those per-call conditions live in :mod:`.epilogues` and in the
ops themselves) and computes what the plain module computes everywhere
else. Where a hook watches one of the submodules a fused form would fold,
the module runs its plain form, so that every hook fires. The plain modules
are the reference the tests hold the fused ones to (within 1e-5).

A package that subclasses a plain module (the DiT's token attention
subclasses :class:`~polaformerpp.models.layers.PolaLinearAttention`) gives its
subclass a fused form with :func:`register_fused_form`; :func:`fuse_modules`
then converts it like the backbone's own modules.

What each fused form does:

* :class:`~.modules.FusedPolaFormerBlock`: the CPE residual folded into its
  conv's centre tap; each branch's output product, bias, layer scale,
  stochastic depth and residual as one compiled pass (forward and backward);
* :class:`~.modules.FusedPolaLinearAttention`: the LePE add and the gate in
  the attention's readout; CPU training of projection -> gated output as one
  autograd Function with a packed gradient;
* :class:`~.modules.FusedRoPESoftmaxAttention`: the epilogue in place;
* :class:`~.modules.FusedConvFFN`: GELU as the first product's post-op (oneDNN)
  or one compiled bias+GELU pass in training, the depthwise residual folded,
  large inference maps in row blocks;
* :class:`~.modules.FusedConvBN`, :class:`~.modules.FusedStem`,
  :class:`~.modules.FusedConvBNAct`: BatchNorm folded into the conv with the
  activation as its post-op (inference);
* :class:`~.modules.FusedChannelLayerNorm`: the output norms transposed to
  NCHW block by block.
"""
import torch.nn as nn

from polaformerpp.models.layers import (
    ChannelLayerNorm,
    ConvBN,
    ConvFFN,
    PolaFormerBlock,
    PolaLinearAttention,
    RoPESoftmaxAttention,
    Stem,
)

from .epilogues import (
    conv_bn_act,
    fold_batch_norm,
    has_module_hooks,
    inference_fusable,
    layer_norm_to_nchw,
    linear_act,
)
from .linear_attention_cpu import PolaLinearAttentionCPU
from .modules import (
    FusedChannelLayerNorm,
    FusedConvBN,
    FusedConvBNAct,
    FusedConvFFN,
    FusedPolaFormerBlock,
    FusedPolaLinearAttention,
    FusedRoPESoftmaxAttention,
    FusedStem,
)

__all__ = ['FUSED_FORMS', 'fuse_modules', 'unfuse_modules', 'is_fused', 'register_fused_form', 'conv_bn_act',
           'fold_batch_norm', 'has_module_hooks', 'inference_fusable', 'layer_norm_to_nchw', 'linear_act',
           'PolaLinearAttentionCPU', 'FusedChannelLayerNorm', 'FusedConvBN', 'FusedConvBNAct', 'FusedConvFFN',
           'FusedPolaFormerBlock', 'FusedPolaLinearAttention', 'FusedRoPESoftmaxAttention', 'FusedStem']

#: plain module class -> its fused form (exact types: a subclass of a plain module keeps its own forward)
FUSED_FORMS = {
    PolaFormerBlock: FusedPolaFormerBlock,
    PolaLinearAttention: FusedPolaLinearAttention,
    RoPESoftmaxAttention: FusedRoPESoftmaxAttention,
    ConvFFN: FusedConvFFN,
    ConvBN: FusedConvBN,
    Stem: FusedStem,
    ChannelLayerNorm: FusedChannelLayerNorm,
}
_PLAIN_FORMS = {fused: plain for plain, fused in FUSED_FORMS.items()}
_PLAIN_FORMS[FusedConvBNAct] = nn.Sequential
#: children of an ``nn.Sequential`` that :class:`~.modules.FusedConvBNAct` runs as one pass
CONV_BN_ACT = (('conv', nn.Conv2d), ('bn', nn.BatchNorm2d), ('act', nn.SiLU))


def register_fused_form(plain: type, fused: type) -> None:
    """Give the module class ``plain`` its fused form ``fused`` (in :data:`FUSED_FORMS`).

    ``fused`` must subclass ``plain``, add no parameters, buffers or state of
    its own and compute what ``plain`` computes (its fast paths where the
    inputs allow), so that :func:`fuse_modules` and :func:`unfuse_modules`
    may swap the two classes of a built module.
    """
    if not (isinstance(plain, type) and issubclass(plain, nn.Module)):
        raise TypeError(f'plain must be an nn.Module subclass, got {plain!r}')
    if not (isinstance(fused, type) and issubclass(fused, plain)):
        raise TypeError(f'fused must be a subclass of {plain.__name__}, got {fused!r}')
    known = FUSED_FORMS.get(plain)
    if known is not None and known is not fused:
        raise ValueError(f'{plain.__name__} already has the fused form {known.__name__}')
    FUSED_FORMS[plain] = fused
    _PLAIN_FORMS[fused] = plain


def _is_conv_bn_act(module: nn.Module) -> bool:
    children = list(module.named_children())
    return (type(module) is nn.Sequential and len(children) == len(CONV_BN_ACT)
            and all(name == n and type(child) is cls for (name, child), (n, cls) in zip(children, CONV_BN_ACT)))


def _fused_form(module: nn.Module):
    if _is_conv_bn_act(module):
        return FusedConvBNAct
    return FUSED_FORMS.get(type(module))


def fuse_modules(model: nn.Module) -> nn.Module:
    """Turn every plain module of ``model`` (itself included) that has a fused form into it, in place.

    Parameters, buffers, hooks, the training flag and the module tree stay as
    they are; the outputs equal the plain modules' (within float rounding).

    Returns:
        nn.Module: ``model``.
    """
    for module in model.modules():
        fused = _fused_form(module)
        if fused is not None:
            module.__class__ = fused
    return model


def unfuse_modules(model: nn.Module) -> nn.Module:
    """The inverse of :func:`fuse_modules`: every fused module back to its plain class, in place."""
    for module in model.modules():
        plain = _PLAIN_FORMS.get(type(module))
        if plain is not None:
            module.__class__ = plain
    return model


def is_fused(module: nn.Module) -> bool:
    """Whether ``module`` is one of the fused forms."""
    return type(module) in _PLAIN_FORMS
