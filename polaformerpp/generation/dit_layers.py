"""Building blocks of DiT (Diffusion Transformer) with a choice of token mixer.

Tokens are ``(B, N, C)`` with ``N = gh * gw`` patches numbered row-major on a
``gh x gw`` grid. Conditioning ``c`` is ``(B, C)`` (timestep + class embedding)
and modulates every block through adaLN-Zero: a zero-initialised
``Linear(C, 6C)`` gives shift/scale/gate for the attention and MLP branches, so
each block starts as the identity.
"""
import math
from typing import Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from polaformerpp.models.layers import PolaLinearAttention

__all__ = [
    'ATTENTION_TYPES', 'sincos_pos_embed_2d', 'timestep_embedding', 'TimestepEmbedder',
    'LabelEmbedder', 'PatchEmbed', 'SoftmaxSelfAttention', 'PolaTokenAttention', 'DiTBlock',
    'FinalLayer', 'modulate'
]

#: token mixers of a DiT block, named as in the backbone's ``attn_types``:
#: ``'linear'`` (PolaFormer++ linear attention) or ``'softmax'`` (the original DiT attention).
ATTENTION_TYPES = ('linear', 'softmax')


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """adaLN modulation: ``x (B, N, C) * (1 + scale (B, C)) + shift (B, C)``."""
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


def sincos_pos_embed_2d(embed_dim: int, grid_h: int, grid_w: int) -> Tensor:
    """Fixed 2-D sin-cos position embedding, ``(grid_h * grid_w, embed_dim)`` fp32.

    The first half of the channels encodes the column index, the second half
    the row index; each half is ``[sin(pos * w) | cos(pos * w)]`` with
    ``w = 1 / 10000 ** (i / (embed_dim / 4))``.
    """
    if embed_dim % 4 != 0:
        raise ValueError(f'embed_dim must be a multiple of 4 for a 2-D sin-cos embedding, '
                         f'got {embed_dim}')
    quarter = embed_dim // 4
    omega = 1.0 / 10000 ** (np.arange(quarter, dtype=np.float64) / quarter)
    rows, cols = np.meshgrid(np.arange(grid_h, dtype=np.float64),
                             np.arange(grid_w, dtype=np.float64), indexing='ij')

    def encode(pos):
        angles = pos.reshape(-1, 1) * omega[None]
        return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)

    table = np.concatenate([encode(cols), encode(rows)], axis=1)
    return torch.from_numpy(table).float()


def timestep_embedding(t: Tensor, dim: int, max_period: float = 10000.0) -> Tensor:
    """Sinusoidal embedding of (possibly fractional) timesteps ``t (B,)`` -> ``(B, dim)``.

    Layout ``[cos(t * f) | sin(t * f)]`` with ``f_i = max_period ** (-i / (dim/2))``.
    """
    half = dim // 2
    freqs = torch.exp(-math.log(max_period)
                      * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


class TimestepEmbedder(nn.Module):
    """Timesteps ``(B,)`` -> sinusoidal features -> MLP -> ``(B, C)``."""

    def __init__(self, hidden_size: int, frequency_dim: int = 256):
        super().__init__()
        self.frequency_dim = frequency_dim
        self.mlp = nn.Sequential(nn.Linear(frequency_dim, hidden_size), nn.SiLU(),
                                 nn.Linear(hidden_size, hidden_size))

    def forward(self, t: Tensor) -> Tensor:
        return self.mlp(timestep_embedding(t, self.frequency_dim))


class LabelEmbedder(nn.Module):
    """Class labels ``(B,)`` -> ``(B, C)``, with label dropout for classifier-free guidance.

    With ``dropout_prob > 0`` the table holds one extra row (index
    ``num_classes``): the "null" class used for the unconditional branch.
    """

    def __init__(self, num_classes: int, hidden_size: int, dropout_prob: float):
        super().__init__()
        if not 0.0 <= dropout_prob < 1.0:
            raise ValueError(f'class_dropout_prob must be in [0, 1), got {dropout_prob}')
        self.num_classes = num_classes
        self.dropout_prob = dropout_prob
        self.embedding_table = nn.Embedding(num_classes + int(dropout_prob > 0), hidden_size)

    @property
    def null_class(self) -> int:
        """Index of the unconditional ("null") label; needs ``dropout_prob > 0``."""
        if self.dropout_prob <= 0:
            raise ValueError('classifier-free guidance needs a model trained with '
                             'class_dropout_prob > 0 (it has no null-class embedding)')
        return self.num_classes

    def forward(self, labels: Tensor) -> Tensor:
        if self.training and self.dropout_prob > 0:
            drop = torch.rand(labels.shape[0], device=labels.device) < self.dropout_prob
            labels = torch.where(drop, torch.full_like(labels, self.num_classes), labels)
        return self.embedding_table(labels)


class PatchEmbed(nn.Module):
    """``(B, in_ch, H, W)`` -> non-overlapping ``p x p`` patches -> tokens ``(B, N, C)``."""

    def __init__(self, patch_size: int, in_channels: int, hidden_size: int):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_channels, hidden_size, patch_size, stride=patch_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class SoftmaxSelfAttention(nn.Module):
    """Multi-head softmax self-attention as in the original DiT (qkv ``C -> 3C``, proj).

    The comparison baseline: no RoPE, no LePE, no gate. ``forward(x (B, N, C), grid)``.
    """

    def __init__(self, embed_dims: int, num_heads: int):
        super().__init__()
        if embed_dims % num_heads != 0:
            raise ValueError(f'hidden_size ({embed_dims}) must be divisible by num_heads ({num_heads})')
        self.num_heads = num_heads
        self.qkv = nn.Linear(embed_dims, 3 * embed_dims)
        self.proj = nn.Linear(embed_dims, embed_dims)

    def forward(self, x: Tensor, grid: Tuple[int, int]) -> Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, h, N, d)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(B, N, C))


class PolaTokenAttention(PolaLinearAttention):
    """PolaFormer++ linear attention on DiT tokens (no RoPE: DiT keeps its absolute embedding).

    :class:`polaformerpp.models.layers.PolaLinearAttention` (input projection
    ``C -> 4C`` into q, k, v and the gate, value split over the two polarity streams, channel-wise
    temperatures, 5x5 LePE on the token grid, gate, output projection) applied
    to a token sequence: ``forward(x (B, N, C), grid (gh, gw)) -> (B, N, C)``.
    """

    def __init__(self, embed_dims: int, num_heads: int, backend: str = 'auto'):
        super().__init__(embed_dims, num_heads, use_rope=False, backend=backend)

    def forward(self, x: Tensor, grid: Tuple[int, int]) -> Tensor:
        B, N, C = x.shape
        if grid[0] * grid[1] != N:
            raise ValueError(f'grid {grid} does not hold the N={N} tokens')
        return super().forward(x.reshape(B, grid[0], grid[1], C)).reshape(B, N, C)


def build_dit_attention(attn_type: str, embed_dims: int, num_heads: int,
                        backend: str = 'auto') -> nn.Module:
    """``'linear'`` -> :class:`PolaTokenAttention`, ``'softmax'`` -> :class:`SoftmaxSelfAttention`."""
    if attn_type == 'linear':
        return PolaTokenAttention(embed_dims, num_heads, backend=backend)
    if attn_type == 'softmax':
        return SoftmaxSelfAttention(embed_dims, num_heads)
    raise ValueError(f'attn_type must be one of {ATTENTION_TYPES}, got {attn_type!r}')


class DiTBlock(nn.Module):
    """``x = x + g1 * Attn(mod(LN(x))); x = x + g2 * MLP(mod(LN(x)))`` with adaLN-Zero.

    LayerNorms have no affine parameters (eps 1e-6); the MLP is
    ``Linear(C, rC) -> GELU(tanh) -> Linear(rC, C)``.
    """

    def __init__(self, hidden_size: int, num_heads: int, mlp_ratio: float = 4.0,
                 attn_type: str = 'linear', attn_backend: str = 'auto'):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = build_dit_attention(attn_type, hidden_size, num_heads, attn_backend)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        mlp_hidden = int(hidden_size * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(hidden_size, mlp_hidden), nn.GELU(approximate='tanh'),
                                 nn.Linear(mlp_hidden, hidden_size))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))

    def forward(self, x: Tensor, c: Tensor, grid: Tuple[int, int]) -> Tensor:
        """``x (B, N, C)``, ``c (B, C)`` -> ``(B, N, C)``."""
        (shift_a, scale_a, gate_a, shift_m, scale_m,
         gate_m) = self.adaLN_modulation(c).chunk(6, dim=-1)
        x = x + gate_a.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_a, scale_a), grid)
        x = x + gate_m.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_m, scale_m))
        return x


class FinalLayer(nn.Module):
    """adaLN-modulated LayerNorm then ``Linear(C, p*p*out_ch)`` (both zero-initialised)."""

    def __init__(self, hidden_size: int, patch_size: int, out_channels: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size))

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=-1)
        return self.linear(modulate(self.norm_final(x), shift, scale))
