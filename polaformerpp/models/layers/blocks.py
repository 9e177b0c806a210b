"""Building blocks of the PolaFormer++ backbone."""
import torch
import torch.nn as nn
from mmcv.cnn.bricks import DropPath
from torch import Tensor

from polaformerpp.ops.depthwise import depthwise_conv2d
from polaformerpp.ops.linear_residual import drop_path_scales, linear_residual_kernel_applies, linear_scaled_residual

from .attention import build_token_mixer
from .fused import conv_bn_act, has_module_hooks, inference_fusable, linear_act, linear_output_bytes

__all__ = ['ConvBN', 'ConvFFN', 'PolaFormerBlock', 'conv_residual']


class ConvBN(nn.Sequential):
    """``Conv2d`` (with bias) followed by ``BatchNorm2d``; submodules ``conv``, ``bn``.

    In CPU inference the BatchNorm is folded into the conv (one pass,
    :func:`~.fused.conv_bn_act`); ``forward(x, act)`` applies an activation
    module after it, fused there too.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding=kernel_size // 2)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x: Tensor, act: nn.Module = None) -> Tensor:
        return conv_bn_act(self.conv, self.bn, act, x)


#: in CPU inference, hidden maps from this size on go through the FFN in row blocks
#: (:meth:`ConvFFN.forward_in_row_blocks`) of about :data:`FFN_BLOCK_BYTES` of hidden activations
FFN_ROW_BLOCKS_FROM_BYTES = 16 * 2**20
FFN_BLOCK_BYTES = 4 * 2**20


class ConvFFN(nn.Module):
    """``Linear(C, F) -> GELU -> x + dwconv3x3(x) -> Linear(F, C)`` on ``(B, H, W, C)``.

    The depthwise conv reads the hidden tokens as a channels-last image (no
    copy); in CPU inference the GELU is the first product's post-op, and
    large maps go through in row blocks (:meth:`forward_in_row_blocks`).
    """

    def __init__(self, embed_dims: int, hidden_dims: int):
        super().__init__()
        self.fc1 = nn.Linear(embed_dims, hidden_dims)
        self.act = nn.GELU()
        self.dwconv = nn.Conv2d(hidden_dims, hidden_dims, 3, padding=1, groups=hidden_dims)
        self.fc2 = nn.Linear(hidden_dims, embed_dims)

    def forward(self, x: Tensor) -> Tensor:
        if self.takes_row_blocks(x):
            return self.forward_in_row_blocks(x)
        return linear_act(self.fc2, None, self.features(x))

    def takes_row_blocks(self, x: Tensor) -> bool:
        """Whether :meth:`forward` goes through :meth:`forward_in_row_blocks` (CPU inference, large maps)."""
        return (inference_fusable(x, self) and x.is_contiguous()
                and not has_module_hooks(self.fc1, self.act, self.dwconv, self.fc2)
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
    """``x + conv(x)`` for channels-last tokens ``x`` ``(B, H, W, C)`` and a channels-preserving ``conv``.

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


class PolaFormerBlock(nn.Module):
    """One block on channels-last tokens ``(B, H, W, C)``::

        x = x + cpe(x)                                  (3x3 depthwise conv)
        x = x + drop_path(gamma1 * attn(norm1(x)))
        x = x + drop_path(gamma2 * ffn(norm2(x)))

    On the CPU in fp32 (and with no hooks on the modules it folds) each
    branch's output product (``attn.proj``, ``ffn.fc2``) folds into its
    residual: the product without its bias, then bias, layer scale, stochastic
    depth and residual in one compiled pass (and one in the backward;
    :func:`~polaformerpp.ops.linear_residual.linear_scaled_residual`).
    Elsewhere, where stochastic depth is off (eval mode or rate 0), each
    layer-scale residual is one ``addcmul``, written into the branch's fresh
    output when autograd does not record.

    Args:
        embed_dims (int): channels C.
        num_heads (int): attention heads.
        attn_type (str): ``'linear'`` (polarity-aware) or ``'softmax'``.
        mlp_ratio (float): FFN hidden width ``int(mlp_ratio * C)``.
        drop_path (float): stochastic depth rate of this block, in ``[0, 1)``
            (mmcv's ``DropPath``: per-sample, kept paths scaled by ``1 / (1 - rate)``,
            identity in eval mode).
        layer_scale_init_value (float): initial value of ``gamma1``/``gamma2``.
        attn_backend (str): :func:`pola_attention` backend of linear attention.
    """

    def __init__(self, embed_dims: int, num_heads: int, attn_type: str = 'linear',
                 mlp_ratio: float = 3.5, drop_path: float = 0.0,
                 layer_scale_init_value: float = 1.0, attn_backend: str = 'auto'):
        super().__init__()
        if not 0.0 <= drop_path < 1.0:
            raise ValueError(f'drop_path must be in [0, 1), got {drop_path}')
        self.attn_type = attn_type
        self.cpe = nn.Conv2d(embed_dims, embed_dims, 3, padding=1, groups=embed_dims)
        self.norm1 = nn.LayerNorm(embed_dims, eps=1e-6)
        self.attn = build_token_mixer(attn_type, embed_dims, num_heads, backend=attn_backend)
        self.norm2 = nn.LayerNorm(embed_dims, eps=1e-6)
        self.ffn = ConvFFN(embed_dims, int(mlp_ratio * embed_dims))
        self.gamma1 = nn.Parameter(torch.full((embed_dims,), float(layer_scale_init_value)))
        self.gamma2 = nn.Parameter(torch.full((embed_dims,), float(layer_scale_init_value)))
        self.drop_path = DropPath(drop_path)

    def scaled_residual(self, x: Tensor, branch: Tensor, gamma: Tensor) -> Tensor:
        """``x + drop_path(gamma * branch)``; one ``addcmul`` where the path is never dropped."""
        if self.training and self.drop_path.drop_prob > 0:
            return x + self.drop_path(gamma * branch)
        if torch.is_grad_enabled() and (x.requires_grad or branch.requires_grad or gamma.requires_grad):
            return torch.addcmul(x, branch, gamma)
        return torch.addcmul(x, branch, gamma, out=branch)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, H, W, C) -> (B, H, W, C)``."""
        x = conv_residual(self.cpe, x)
        if (linear_residual_kernel_applies(x, x, self.attn.proj.weight, self.attn.proj.bias, self.gamma1)
                and not has_module_hooks(self.attn, self.attn.proj, self.ffn, self.ffn.fc2)):
            # CPU fp32: each branch's output product, bias, layer scale and residual in one pass
            # (the FFN's row blocks of large inference maps keep their own product)
            x = self.linear_residual(x, self.attn.features(self.norm1(x)), self.attn.proj, self.gamma1)
            branch_input = self.norm2(x)
            if self.ffn.takes_row_blocks(branch_input):
                return self.scaled_residual(x, self.ffn(branch_input), self.gamma2)
            return self.linear_residual(x, self.ffn.features(branch_input), self.ffn.fc2, self.gamma2)
        x = self.scaled_residual(x, self.attn(self.norm1(x)), self.gamma1)
        return self.scaled_residual(x, self.ffn(self.norm2(x)), self.gamma2)

    def linear_residual(self, x: Tensor, features: Tensor, linear: nn.Linear, gamma: Tensor) -> Tensor:
        """``x + drop_path(gamma * linear(features))``, as one
        :func:`~polaformerpp.ops.linear_residual.linear_scaled_residual`."""
        scales = None
        if self.training and self.drop_path.drop_prob > 0:
            scales = drop_path_scales(x.shape[0], self.drop_path.drop_prob, x)
        return linear_scaled_residual(x, features.reshape(*x.shape[:-1], -1), linear.weight, linear.bias, gamma,
                                      scales)
