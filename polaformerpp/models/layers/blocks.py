"""Building blocks of the PolaFormer++ backbone."""
import torch
import torch.nn as nn
from mmcv.cnn.bricks import DropPath
from torch import Tensor

from .attention import build_token_mixer

__all__ = ['ConvBN', 'ConvFFN', 'PolaFormerBlock']


class ConvBN(nn.Sequential):
    """``Conv2d`` (with bias) followed by ``BatchNorm2d``; submodules ``conv``, ``bn``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding=kernel_size // 2)
        self.bn = nn.BatchNorm2d(out_channels)


class ConvFFN(nn.Module):
    """``Linear(C, F) -> GELU -> x + dwconv3x3(x) -> Linear(F, C)`` on ``(B, H, W, C)``."""

    def __init__(self, embed_dims: int, hidden_dims: int):
        super().__init__()
        self.fc1 = nn.Linear(embed_dims, hidden_dims)
        self.act = nn.GELU()
        self.dwconv = nn.Conv2d(hidden_dims, hidden_dims, 3, padding=1, groups=hidden_dims)
        self.fc2 = nn.Linear(hidden_dims, embed_dims)

    def forward(self, x: Tensor) -> Tensor:
        x = self.act(self.fc1(x))
        x = x + self.dwconv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        return self.fc2(x)


class PolaFormerBlock(nn.Module):
    """One block on ``(B, C, H, W)``::

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

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.cpe(x)
        x = x.permute(0, 2, 3, 1)
        x = x + self.drop_path(self.gamma1 * self.attn(self.norm1(x)))
        x = x + self.drop_path(self.gamma2 * self.ffn(self.norm2(x)))
        return x.permute(0, 3, 1, 2)
