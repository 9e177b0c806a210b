"""Building blocks of the PolaFormer++ backbone, as the method states them.

Plain PyTorch modules: every submodule is called as a module. Their fused
forms (same parameters, same outputs) are in :mod:`polaformerpp.ops.fusion`.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn.bricks import DropPath
from torch import Tensor

from .attention import build_token_mixer

__all__ = ['ConvBN', 'Stem', 'ConvFFN', 'PolaFormerBlock', 'ChannelLayerNorm']


class ConvBN(nn.Sequential):
    """``Conv2d`` (with bias) followed by ``BatchNorm2d``; submodules ``conv``, ``bn``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding=kernel_size // 2)
        self.bn = nn.BatchNorm2d(out_channels)


class Stem(nn.Sequential):
    """Four 3x3 conv+BN (stride 2, 1, 1, 2), GELU after the first three: ``(B, 3, H, W) -> (B, C, H/4, W/4)``."""

    def __init__(self, in_channels: int, embed_dims: int):
        mid = embed_dims // 2
        super().__init__(
            ConvBN(in_channels, mid, stride=2), nn.GELU(),
            ConvBN(mid, mid), nn.GELU(),
            ConvBN(mid, mid), nn.GELU(),
            ConvBN(mid, embed_dims, stride=2))


class ConvFFN(nn.Module):
    """``Linear(C, F) -> GELU -> x + dwconv3x3(x) -> Linear(F, C)`` on tokens ``(B, H, W, C)``."""

    def __init__(self, embed_dims: int, hidden_dims: int):
        super().__init__()
        self.fc1 = nn.Linear(embed_dims, hidden_dims)
        self.act = nn.GELU()
        self.dwconv = nn.Conv2d(hidden_dims, hidden_dims, 3, padding=1, groups=hidden_dims)
        self.fc2 = nn.Linear(hidden_dims, embed_dims)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, H, W, C) -> (B, H, W, C)``."""
        x = self.act(self.fc1(x))
        x = x + self.dwconv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        return self.fc2(x)


class PolaFormerBlock(nn.Module):
    """One block on tokens ``(B, H, W, C)``::

        x = x + cpe(x)                                  (3x3 depthwise conv)
        x = x + drop_path(gamma1 * attn(norm1(x)))
        x = x + drop_path(gamma2 * ffn(norm2(x)))

    Args:
        embed_dims (int): channels C.
        num_heads (int): attention heads.
        attn_type (str): ``'linear'`` (polarity-aware) or ``'softmax'``.
        mlp_ratio (float): FFN hidden width ``int(mlp_ratio * C)``.
        drop_path (float): stochastic depth rate of this block, in ``[0, 1)``
            (mmcv's ``DropPath``: per-sample, kept paths scaled by ``1 / (1 - rate)``,
            identity in eval mode).
        layer_scale_init_value (float): initial value of ``gamma1``/``gamma2``.
        attn_backend (str): :func:`~polaformerpp.ops.pola_attention` backend of linear attention.
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

    def forward(self, x: Tensor) -> Tensor:
        """``(B, H, W, C) -> (B, H, W, C)``."""
        x = x + self.cpe(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        x = x + self.drop_path(self.gamma1 * self.attn(self.norm1(x)))
        return x + self.drop_path(self.gamma2 * self.ffn(self.norm2(x)))


class ChannelLayerNorm(nn.LayerNorm):
    """LayerNorm over the channels of tokens ``(B, H, W, C)``; returns a contiguous ``(B, C, H, W)``.

    (A channels-last result would propagate through necks and break ops that
    read NCHW memory directly: mmcv's RoIAlign then pools the wrong values.)
    """

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps).permute(0, 3, 1, 2).contiguous()
