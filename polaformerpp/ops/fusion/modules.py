"""Fused forms of the network's modules: the same parameters and outputs, fewer passes on the CPU.

Each class subclasses its plain module of :mod:`polaformerpp.models.layers`
and adds no state: :func:`~polaformerpp.ops.fusion.fuse_modules` turns a
built plain module into its fused form in place (the module tree, parameter
names and checkpoint keys are unchanged). Each ``forward`` takes its fused
form where the inputs allow it (the conditions live in the helpers of
:mod:`.epilogues` and in the ops) and otherwise computes what the plain
module does. Where hooks watch a submodule a fused form would fold, the
module runs its plain form, so every hook fires.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from polaformerpp.models.layers import (
    ChannelLayerNorm,
    ConvBN,
    ConvFFN,
    GatedAttention,
    PolaFormerBlock,
    PolaLinearAttention,
    RoPESoftmaxAttention,
    Stem,
)

from ..depthwise import depthwise_conv2d
from ..linear_residual import drop_path_scales, linear_residual_kernel_applies, linear_scaled_residual
from ..pola_attention import as_rope_halves, exponent_shift_needed, gated_output, pola_attention_gated
from ..rope import RopeGrid, apply_rope_2d
from .epilogues import (
    conv_bn_act,
    has_module_hooks,
    inference_fusable,
    layer_norm_to_nchw,
    linear_act,
    linear_output_bytes,
)
from .linear_attention_cpu import DEFAULT_EPS, PolaLinearAttentionCPU, fused_training_applies

__all__ = ['FusedConvBN', 'FusedStem', 'FusedConvBNAct', 'FusedConvFFN', 'FusedGatedAttention',
           'FusedPolaLinearAttention', 'FusedRoPESoftmaxAttention', 'FusedPolaFormerBlock',
           'FusedChannelLayerNorm', 'conv_residual', 'FFN_ROW_BLOCKS_FROM_BYTES', 'FFN_BLOCK_BYTES']


class FusedConvBN(ConvBN):
    """:class:`ConvBN`; in CPU inference the BatchNorm folded into the conv (one pass,
    :func:`~.epilogues.conv_bn_act`). ``forward(x, act)`` applies an activation module
    after it, fused there too."""

    def forward(self, x: Tensor, act: Optional[nn.Module] = None) -> Tensor:
        return conv_bn_act(self.conv, self.bn, act, x)


class FusedStem(Stem):
    """:class:`Stem` with each conv+BN+GELU one pass in CPU inference (its :class:`FusedConvBN`), on
    channels-last memory: the network's tokens ``(B, H, W, C)`` are then dense from the stem on (the
    layout every fused form reads)."""

    def forward(self, x: Tensor) -> Tensor:
        x = x.contiguous(memory_format=torch.channels_last)
        layers = list(self)
        if not all(isinstance(layer, FusedConvBN) for layer in layers[::2]):
            return super().forward(x)
        for i in range(0, len(layers), 2):
            x = layers[i](x, layers[i + 1] if i + 1 < len(layers) else None)
        return x


class FusedConvBNAct(nn.Sequential):
    """An ``nn.Sequential`` of ``conv``, ``bn``, ``act`` (the classification projection) as one
    :func:`~.epilogues.conv_bn_act`."""

    def forward(self, x: Tensor) -> Tensor:
        return conv_bn_act(self.conv, self.bn, self.act, x)


class FusedChannelLayerNorm(ChannelLayerNorm):
    """:class:`ChannelLayerNorm`, transposed to NCHW block by block in cache
    (:func:`~.epilogues.layer_norm_to_nchw`)."""

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm_to_nchw(self, x)


#: in CPU inference, hidden maps from this size on go through the FFN in row blocks
#: (:meth:`FusedConvFFN.forward_in_row_blocks`) of about :data:`FFN_BLOCK_BYTES` of hidden activations
FFN_ROW_BLOCKS_FROM_BYTES = 16 * 2**20
FFN_BLOCK_BYTES = 4 * 2**20


class FusedConvFFN(ConvFFN):
    """:class:`ConvFFN` with the GELU as the first product's post-op in CPU inference, the
    depthwise residual folded into the conv, and large inference maps in row blocks
    (:meth:`forward_in_row_blocks`)."""

    def forward(self, x: Tensor) -> Tensor:
        if has_module_hooks(self.fc1, self.act, self.dwconv, self.fc2):
            return super().forward(x)
        if self.takes_row_blocks(x):
            return self.forward_in_row_blocks(x)
        return linear_act(self.fc2, None, self.features(x))

    def takes_row_blocks(self, x: Tensor) -> bool:
        """Whether :meth:`forward` goes through :meth:`forward_in_row_blocks` (CPU inference, large maps)."""
        # read at call time, so that tests may lower the threshold
        return (inference_fusable(x, self) and x.is_contiguous()
                and linear_output_bytes(x, self.fc1) >= FFN_ROW_BLOCKS_FROM_BYTES)

    def features(self, x: Tensor) -> Tensor:
        """``(B, H, W, C) -> (B, H, W, F)``: the hidden tokens ``fc2`` reads."""
        return conv_residual(self.dwconv, linear_act(self.fc1, self.act, x))

    def forward_in_row_blocks(self, x: Tensor, block_bytes: int = FFN_BLOCK_BYTES) -> Tensor:
        """:meth:`forward` one block of image rows at a time (inference; ``x`` contiguous ``(B, H, W, C)``).

        Each block's hidden rows, with one halo row on each side for the 3x3
        conv, are computed, convolved and projected back while in cache, and
        the block's output rows are written into the result: the ``(B, H, W, F)``
        hidden maps never exist. A whole-map hidden tensor pays its page faults
        on every call (glibc maps allocations above 32 MiB afresh) and leaves
        the cache between the three passes. The halo rows cost ``2 / rows``
        extra ``fc1`` and conv work.
        """
        B, H, W, C = x.shape
        out = x.new_empty(B, H, W, self.fc2.out_features)
        rows = max(1, block_bytes // (W * self.fc1.out_features * x.element_size()))
        for b in range(B):
            for start in range(0, H, rows):
                stop = min(H, start + rows)
                low, high = max(0, start - 1), min(H, stop + 1)
                hidden = linear_act(self.fc1, self.act, x[b:b + 1, low:high])  # (1, rows + halo, W, F)
                # zero padding stands for the rows outside the image; the halo rows' own outputs are dropped
                conv = self.dwconv(hidden.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
                mixed = conv[:, start - low:stop - low].add_(hidden[:, start - low:stop - low])
                torch.addmm(self.fc2.bias, mixed.reshape(-1, mixed.shape[-1]), self.fc2.weight.t(),
                            out=out[b, start:stop].view(-1, out.shape[-1]))
        return out


def conv_residual(conv: nn.Module, x: Tensor) -> Tensor:
    """``x + conv(x)`` for tokens ``x`` ``(B, H, W, C)`` and a channels-preserving ``conv``.

    The conv sees ``x`` as a channels-last image and returns one, so both terms
    share the token layout (no layout change either way). For a depthwise conv
    with 'same' padding (the backbone's) the residual is folded into the kernel,
    ``x + conv(x) = conv'(x)`` with ``w' = w + 1`` at the centre tap: one pass
    instead of a conv and an add, and under autograd no gradient sum either
    (the identity's share of the input gradient comes out of the conv's
    backward). Otherwise ``x`` is added to the conv's output (in place where
    autograd does not record).
    """
    image = x.permute(0, 3, 1, 2)
    if _residual_foldable(conv, x.shape[-1]) and not has_module_hooks(conv):
        return depthwise_conv2d(image, conv.weight + _centre_tap(conv.weight), conv.bias).permute(0, 2, 3, 1)
    y = conv(image).permute(0, 2, 3, 1)
    return x + y if y.requires_grad else y.add_(x)


def _residual_foldable(conv: nn.Module, channels: int) -> bool:
    """A depthwise ``nn.Conv2d`` (stride 1, no dilation, zero 'same' padding of an odd kernel)."""
    if type(conv) is not nn.Conv2d or conv.padding_mode != 'zeros':
        return False
    kh, kw = conv.kernel_size
    return (conv.groups == channels == conv.in_channels == conv.out_channels and kh % 2 == 1 and kw % 2 == 1
            and conv.stride == (1, 1) and conv.dilation == (1, 1) and conv.padding == (kh // 2, kw // 2))


def _centre_tap(weight: Tensor) -> Tensor:
    """``(C, 1, kh, kw)`` zeros with a one at each kernel's centre: the identity as a depthwise kernel."""
    delta = torch.zeros_like(weight, requires_grad=False)
    delta[:, :, weight.shape[2] // 2, weight.shape[3] // 2] = 1
    return delta


class FusedGatedAttention(GatedAttention):
    """What the fused token mixers share: :meth:`features`, the gated attention output before
    ``proj``, in one token layout (q, k and the gate strided views of the projection, the LePE
    convolution on channels-last memory returning tokens), and ``proj`` applied to it (a fused
    block may instead fold ``proj`` into its residual)."""

    def forward(self, x: Tensor) -> Tensor:
        """``(B, H, W, C) -> (B, H, W, C)``."""
        if has_module_hooks(self.in_proj, self.lepe, self.proj):
            return super().forward(x)
        B, H, W, C = x.shape
        return linear_act(self.proj, None, self.features(x)).view(B, H, W, C)

    def features(self, x: Tensor) -> Tensor:
        """``(B, H, W, C) -> (B, N, C)``: the gated attention output, what ``proj`` reads."""
        raise NotImplementedError

    def split_projection(self, proj: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """As the plain module's, with ``v`` copied to dense memory (the one copy: the depthwise LePE
        reads dense channels-last memory); ``q``, ``k`` and the gate stay strided views."""
        B, H, W, _ = proj.shape
        q, k, v, gate = proj.chunk(4, dim=-1)
        v = v.contiguous()

        def heads(t):
            return t.reshape(B, H * W, self.num_heads, self.head_dim).transpose(1, 2)

        return heads(q), heads(k), heads(v), gate, v.permute(0, 3, 1, 2)

    def lepe_tokens(self, v_image: Tensor) -> Tensor:
        """The LePE term in the token layout: ``(B, C, H, W)`` (channels-last) ``-> (B, N, C)``."""
        B, C, H, W = v_image.shape
        lepe = depthwise_conv2d(v_image, self.lepe.weight, self.lepe.bias)
        return lepe.permute(0, 2, 3, 1).reshape(B, H * W, C)


class FusedPolaLinearAttention(FusedGatedAttention, PolaLinearAttention):
    """:class:`PolaLinearAttention` with the LePE add and the gate in the op's readout
    (:func:`~polaformerpp.ops.pola_attention_gated`), and CPU training of the step from the
    projection to the gated output as one Function (:class:`~.linear_attention_cpu.PolaLinearAttentionCPU`)."""

    def features(self, x: Tensor) -> Tensor:
        B, H, W, C = x.shape
        proj = linear_act(self.in_proj, None, x)
        rope = RopeGrid(H, W) if self.use_rope else None  # the backends build the rotation
        if fused_training_applies(x, self.backend):
            out = self.fused_training_forward(proj, rope)
            if out is not None:
                return out
        q, k, v, gate, v_image = self.split_projection(proj)
        return pola_attention_gated(q, k, v, self.temp_same.sigmoid(), self.temp_opp.sigmoid(),
                                    self.lepe_tokens(v_image), gate.reshape(B, H * W, C), rope=rope,
                                    backend=self.backend, lepe_writable=True)

    def fused_training_forward(self, proj: Tensor, rope: Optional[RopeGrid]) -> Optional[Tensor]:
        """The step from the projection to ``(B, N, C)`` as one Function; None for inputs that
        need exponent shifts (the plain form follows them)."""
        C = proj.shape[-1] // 4
        temp_same, temp_opp = self.temp_same.sigmoid(), self.temp_opp.sigmoid()
        q, k = (proj[..., i * C:(i + 1) * C].flatten(1, 2) for i in range(2))
        heads = [t.unflatten(-1, (self.num_heads, -1)).transpose(1, 2) for t in (q, k)]
        if exponent_shift_needed(*heads, temp_same, temp_opp):
            return None
        rope = as_rope_halves(rope, self.head_dim)
        return PolaLinearAttentionCPU.apply(proj.contiguous(), temp_same, temp_opp, self.lepe.weight, self.lepe.bias,
                                            self.num_heads, rope, DEFAULT_EPS)


class FusedRoPESoftmaxAttention(FusedGatedAttention, RoPESoftmaxAttention):
    """:class:`RoPESoftmaxAttention` with the LePE add and the gate in place on the conv's
    fresh output where autograd does not record."""

    def features(self, x: Tensor) -> Tensor:
        B, H, W, C = x.shape
        q, k, v, gate, v_image = self.split_projection(linear_act(self.in_proj, None, x))
        if self.use_rope:
            q, k = apply_rope_2d(H, W, q, k)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        lepe, gate = self.lepe_tokens(v_image), gate.reshape(B, H * W, C)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (out, lepe, gate)):
            return gated_output(out, lepe, gate)
        # in place on the conv's fresh output, in the token layout (sdpa's backward would need its output)
        lepe.view(B, H * W, self.num_heads, self.head_dim).add_(out.transpose(1, 2))
        return lepe.mul_(gate)


class FusedPolaFormerBlock(PolaFormerBlock):
    """:class:`PolaFormerBlock` with the residuals fused.

    On the CPU in fp32 (and with no hooks in the token mixer or the FFN) each
    branch's output product (``attn.proj``, ``ffn.fc2``) folds into its
    residual: the product without its bias, then bias, layer scale, stochastic
    depth and residual in one compiled pass (and one in the backward;
    :func:`~polaformerpp.ops.linear_residual.linear_scaled_residual`).
    Elsewhere, where stochastic depth is off (eval mode or rate 0), each
    layer-scale residual is one ``addcmul``, written into the branch's fresh
    output when autograd does not record. The CPE residual is folded into its
    conv (:func:`conv_residual`).
    """

    def forward(self, x: Tensor) -> Tensor:
        x = conv_residual(self.cpe, x)
        if (isinstance(self.attn, FusedGatedAttention) and isinstance(self.ffn, FusedConvFFN)
                and linear_residual_kernel_applies(x, x, self.attn.proj.weight, self.attn.proj.bias, self.gamma1)
                and not has_module_hooks(*self.attn.modules(), *self.ffn.modules())):
            # CPU fp32: each branch's output product, bias, layer scale and residual in one pass
            # (the FFN's row blocks of large inference maps keep their own product)
            x = self.linear_residual(x, self.attn.features(self.norm1(x)), self.attn.proj, self.gamma1)
            branch_input = self.norm2(x)
            if self.ffn.takes_row_blocks(branch_input):
                return self.scaled_residual(x, self.ffn(branch_input), self.gamma2)
            return self.linear_residual(x, self.ffn.features(branch_input), self.ffn.fc2, self.gamma2)
        x = self.scaled_residual(x, self.attn(self.norm1(x)), self.gamma1)
        return self.scaled_residual(x, self.ffn(self.norm2(x)), self.gamma2)

    def scaled_residual(self, x: Tensor, branch: Tensor, gamma: Tensor) -> Tensor:
        """``x + drop_path(gamma * branch)``; one ``addcmul`` where the path is never dropped."""
        if self.training and self.drop_path.drop_prob > 0:
            return x + self.drop_path(gamma * branch)
        if torch.is_grad_enabled() and (x.requires_grad or branch.requires_grad or gamma.requires_grad):
            return torch.addcmul(x, branch, gamma)
        return torch.addcmul(x, branch, gamma, out=branch)

    def linear_residual(self, x: Tensor, features: Tensor, linear: nn.Linear, gamma: Tensor) -> Tensor:
        """``x + drop_path(gamma * linear(features))``, as one
        :func:`~polaformerpp.ops.linear_residual.linear_scaled_residual`."""
        scales = None
        if self.training and self.drop_path.drop_prob > 0:
            scales = drop_path_scales(x.shape[0], self.drop_path.drop_prob, x)
        return linear_scaled_residual(x, features.reshape(*x.shape[:-1], -1), linear.weight, linear.bias, gamma,
                                      scales)
