"""Building blocks of the lightweight SR network (channels-last ``(B, H, W, C)`` maps).

An :class:`AttentiveLayer` has two halves, each ``token mixer + gated MLP``:

1. local: LayerNorm -> :class:`ShiftedWindowAttention`;
2. global: LayerNorm -> :class:`GlobalPolaAttention` (PolaFormer++ linear
   attention over the whole image, in place of MambaIRv2's attentive
   state-space scan).

Each half computes ``y = x + mixer(norm(x)); y = y + mlp(norm(y))`` and
returns ``y + scale * x`` with a per-channel layer scale initialised to 1e-4
(MambaIRv2's arrangement of the residuals).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from polaformerpp.models.layers import PolaLinearAttention

from .window_attention import ShiftedWindowAttention

__all__ = ['GatedMLP', 'GlobalPolaAttention', 'AttentiveLayer', 'ResidualGroup']


class _DepthwiseConv(nn.Conv2d):
    """Depthwise ``k x k`` conv applied to a channels-last map."""

    def __init__(self, channels: int, kernel_size: int):
        super().__init__(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels)

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


class GatedMLP(nn.Module):
    """``Linear(C, F)``, GELU, split ``F`` into halves a, b; ``a * dwconv5x5(LN(b))``; ``Linear(F/2, C)``.

    Args:
        embed_dims (int): channels C.
        hidden_dims (int): F, even.
        kernel_size (int): depthwise conv of the spatial gate.
    """

    def __init__(self, embed_dims: int, hidden_dims: int, kernel_size: int = 5):
        super().__init__()
        if hidden_dims % 2 != 0:
            raise ValueError(f'hidden_dims must be even to split the gate, got {hidden_dims}')
        self.fc1 = nn.Linear(embed_dims, hidden_dims)
        self.gate_norm = nn.LayerNorm(hidden_dims // 2)
        self.gate_conv = _DepthwiseConv(hidden_dims // 2, kernel_size)
        self.fc2 = nn.Linear(hidden_dims // 2, embed_dims)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, H, W, C) -> (B, H, W, C)``."""
        a, b = F.gelu(self.fc1(x)).chunk(2, dim=-1)
        return self.fc2(a * self.gate_conv(self.gate_norm(b)))


class GlobalPolaAttention(nn.Module):
    """Global branch: ``1x1 conv``, ``x * sigmoid(dwconv3x3(x))``, PolaFormer++ attention, LN, Linear.

    The attention is the project's :class:`PolaLinearAttention` (polarity-aware
    feature maps, channel-wise temperatures, RoPE over the ``2d`` feature
    channels, 5x5 LePE, gate), so the Triton backend serves it on GPU.

    Args:
        embed_dims (int): channels C.
        num_heads (int): heads; ``head_dim = hidden / num_heads`` (12 in the paper).
        hidden_dims (int): channels inside the branch (``mlp_ratio * C``).
        backend (str): :func:`polaformerpp.ops.pola_attention` backend.
    """

    def __init__(self, embed_dims: int, num_heads: int, hidden_dims: int,
                 backend: str = 'auto', use_rope: bool = True):
        super().__init__()
        self.in_proj = nn.Linear(embed_dims, hidden_dims)  # the 1x1 conv, channels-last
        self.cpe = _DepthwiseConv(hidden_dims, 3)
        self.attn = PolaLinearAttention(hidden_dims, num_heads, use_rope=use_rope, backend=backend,
                                        lepe_kernel_size=5)
        self.out_norm = nn.LayerNorm(hidden_dims)
        self.out_proj = nn.Linear(hidden_dims, embed_dims)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, H, W, C) -> (B, H, W, C)``; attention over all ``H * W`` tokens."""
        x = self.in_proj(x)
        x = x * torch.sigmoid(self.cpe(x))
        return self.out_proj(self.out_norm(self.attn(x)))


class AttentiveLayer(nn.Module):
    """Window attention + gated MLP, then global PolaFormer++ attention + gated MLP.

    Args:
        embed_dims (int): channels C.
        num_heads (int): heads of both attentions.
        window_size (int): window side of the local attention.
        shift_size (int): window shift (``window_size // 2`` on odd layers).
        mlp_ratio (float): hidden width of the MLPs and the global branch, times C.
        layer_scale_init (float): initial per-channel scale of the shortcut terms.
        backend (str): PolaFormer++ attention backend.
    """

    def __init__(self, embed_dims: int, num_heads: int, window_size: int = 16, shift_size: int = 0,
                 mlp_ratio: float = 1.0, layer_scale_init: float = 1e-4, backend: str = 'auto'):
        super().__init__()
        hidden = int(embed_dims * mlp_ratio)
        self.norm1 = nn.LayerNorm(embed_dims)
        self.window_attn = ShiftedWindowAttention(embed_dims, num_heads, window_size, shift_size)
        self.norm2 = nn.LayerNorm(embed_dims)
        self.mlp1 = GatedMLP(embed_dims, hidden)
        self.norm3 = nn.LayerNorm(embed_dims)
        self.global_attn = GlobalPolaAttention(embed_dims, num_heads, hidden, backend)
        self.norm4 = nn.LayerNorm(embed_dims)
        self.mlp2 = GatedMLP(embed_dims, hidden)
        self.scale1 = nn.Parameter(torch.full((embed_dims,), layer_scale_init))
        self.scale2 = nn.Parameter(torch.full((embed_dims,), layer_scale_init))

    def forward(self, x: Tensor) -> Tensor:
        """``(B, H, W, C) -> (B, H, W, C)``."""
        y = x + self.window_attn(self.norm1(x))
        y = y + self.mlp1(self.norm2(y))
        x = y + self.scale1 * x
        y = x + self.global_attn(self.norm3(x))
        y = y + self.mlp2(self.norm4(y))
        return y + self.scale2 * x


class ResidualGroup(nn.Module):
    """``depth`` attentive layers (shift on odd ones), a 3x3 conv, and a residual: ``(B, C, H, W)``."""

    def __init__(self, embed_dims: int, depth: int, num_heads: int, window_size: int = 16,
                 mlp_ratio: float = 1.0, backend: str = 'auto'):
        super().__init__()
        self.layers = nn.ModuleList([
            AttentiveLayer(embed_dims, num_heads, window_size,
                           shift_size=0 if i % 2 == 0 else window_size // 2,
                           mlp_ratio=mlp_ratio, backend=backend) for i in range(depth)
        ])
        self.conv = nn.Conv2d(embed_dims, embed_dims, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, C, H, W) -> (B, C, H, W)``."""
        y = x.permute(0, 2, 3, 1)
        for layer in self.layers:
            y = layer(y)
        return self.conv(y.permute(0, 3, 1, 2)) + x
