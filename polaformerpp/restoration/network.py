"""PolaPPSRLight: lightweight SR with PolaFormer++ global attention (MambaIRv2-light layout).

::

    LR (B, 3, h, w), mean-subtracted, [0, 1] range
      -> conv3x3 (3 -> C) ---------------------------------------+
      -> LayerNorm -> 4 x ResidualGroup(5 x AttentiveLayer, conv3x3, +)
      -> LayerNorm -> conv3x3 ---------------------------------(+)
      -> conv3x3 (C -> 3 s^2) -> PixelShuffle(s)
    SR (B, 3, s h, s w), same normalisation as the input

With the published setting (C = 48, depths 5,5,5,5, 4 heads of 12 channels,
window 16, MLP ratio 1) it has 930,347 parameters at x3 (923,852 at x2,
939,440 at x4).
"""
from typing import Sequence

import torch.nn as nn
from mmengine.model import BaseModule
from mmengine.registry import MODELS
from torch import Tensor

from polaformerpp.ops.fusion import fuse_modules

from .blocks import ResidualGroup

__all__ = ['PolaPPSRLight']


@MODELS.register_module()
class PolaPPSRLight(BaseModule):
    """Lightweight image super-resolution network with PolaFormer++ attention.

    Args:
        upscale (int): scale factor s (>= 1; 2, 3, 4 in the paper).
        in_channels (int): image channels (3, RGB).
        embed_dims (int): feature channels C. Default 48.
        depths (Sequence[int]): attentive layers per residual group. Default (5, 5, 5, 5).
        num_heads (int): heads of the window and the global attention. Default 4.
        window_size (int): local window side. Default 16.
        mlp_ratio (float): MLP / global-branch width over C. Default 1.0.
        attn_backend (str): PolaFormer++ op backend (``'auto'``: Triton on GPU).
        fused (bool): run the fused forms of the PolaFormer++ layers
            (:func:`polaformerpp.ops.fusion.fuse_modules`: same parameters and
            outputs); False keeps the plain modules. Default True.
        init_cfg: mmengine init config (e.g. ``Pretrained``).

    Input ``(B, in_channels, h, w)`` with any ``h, w >= 1``; output
    ``(B, in_channels, s*h, s*w)``.
    """

    def __init__(self, upscale: int = 3, in_channels: int = 3, embed_dims: int = 48,
                 depths: Sequence[int] = (5, 5, 5, 5), num_heads: int = 4, window_size: int = 16,
                 mlp_ratio: float = 1.0, attn_backend: str = 'auto', fused: bool = True, init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        if not isinstance(upscale, int) or isinstance(upscale, bool) or upscale < 1:
            raise ValueError(f'upscale must be a positive int, got {upscale!r}')
        if not depths or any(d < 1 for d in depths):
            raise ValueError(f'depths must be a non-empty sequence of positive ints, got {depths!r}')
        self.upscale = upscale
        self.in_channels = in_channels
        self.window_size = window_size
        self.conv_first = nn.Conv2d(in_channels, embed_dims, 3, padding=1)
        self.norm_in = nn.LayerNorm(embed_dims)
        self.groups = nn.ModuleList([
            ResidualGroup(embed_dims, depth, num_heads, window_size, mlp_ratio, attn_backend)
            for depth in depths
        ])
        self.norm_out = nn.LayerNorm(embed_dims)
        self.conv_after_body = nn.Conv2d(embed_dims, embed_dims, 3, padding=1)
        self.upsample = nn.Sequential(
            nn.Conv2d(embed_dims, in_channels * upscale ** 2, 3, padding=1), nn.PixelShuffle(upscale))
        self.apply(self._init_module)
        if fused:
            fuse_modules(self)

    @staticmethod
    def _init_module(m: nn.Module) -> None:
        # MambaIRv2's init: truncated normal (std 0.02) Linear weights, zero
        # biases, unit LayerNorms; convs keep PyTorch's default.
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    @staticmethod
    def _channels_last_norm(norm: nn.LayerNorm, x: Tensor) -> Tensor:
        return norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, in_channels, h, w) -> (B, in_channels, s*h, s*w)``."""
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f'PolaPPSRLight expects input of shape (B, {self.in_channels}, h, w), '
                             f'got {tuple(x.shape)} (convert grayscale images to RGB first)')
        shallow = self.conv_first(x)
        y = self._channels_last_norm(self.norm_in, shallow)
        for group in self.groups:
            y = group(y)
        y = self.conv_after_body(self._channels_last_norm(self.norm_out, y)) + shallow
        return self.upsample(y)
