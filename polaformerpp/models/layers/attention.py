"""Token mixers of PolaFormer++: polarity-aware linear attention and RoPE softmax attention.

Both take and return tokens ``(B, H, W, C)`` and read as the method states
them: project (``in_proj = Linear(C, 4C)`` gives ``[q | k | v | gate]``) ->
split heads -> attention (one op call) -> add the LePE (a 5x5 depthwise conv
of ``v``) and multiply the gate -> output projection ``proj = Linear(C, C)``.
(The authors name the input projection ``qkvg`` in linear and ``qkvo`` in
softmax blocks; the checkpoint converter maps both to ``in_proj``.) Their
fused forms (same parameters, same outputs) are in :mod:`polaformerpp.ops.fusion`.
"""
from typing import Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from polaformerpp.ops import RopeGrid, apply_rope_2d, pola_attention

__all__ = ['GatedAttention', 'PolaLinearAttention', 'RoPESoftmaxAttention', 'build_token_mixer']


class GatedAttention(nn.Module):
    """What both token mixers share: ``in_proj``, the head split, ``lepe``, the gate and ``proj``.

    Subclasses implement :meth:`attention`, the attention over the heads.

    Args:
        embed_dims (int): channels C.
        num_heads (int): heads h; ``C % h == 0``.
        lepe_kernel_size (int): kernel of the depthwise LePE conv. Default 5.
    """

    def __init__(self, embed_dims: int, num_heads: int, lepe_kernel_size: int = 5):
        super().__init__()
        if num_heads < 1 or embed_dims % num_heads != 0:
            raise ValueError(f'embed_dims ({embed_dims}) must be divisible by num_heads ({num_heads})')
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.head_dim = embed_dims // num_heads
        self.in_proj = nn.Linear(embed_dims, 4 * embed_dims)
        self.lepe = nn.Conv2d(embed_dims, embed_dims, lepe_kernel_size,
                              padding=lepe_kernel_size // 2, groups=embed_dims)
        self.proj = nn.Linear(embed_dims, embed_dims)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, H, W, C) -> (B, H, W, C)``."""
        B, H, W, C = x.shape
        q, k, v, gate, v_image = self.split_heads(x)
        out = self.attention(q, k, v, H, W).transpose(1, 2).reshape(B, H, W, C)
        out = out + self.lepe(v_image).permute(0, 2, 3, 1)
        return self.proj(out * gate)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, height: int, width: int) -> Tensor:
        """``q, k, v`` ``(B, h, N, d)`` of an ``height x width`` token grid -> ``(B, h, N, d)``."""
        raise NotImplementedError

    def split_heads(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Project ``x`` ``(B, H, W, C)`` and split it into heads: :meth:`split_projection` of ``in_proj(x)``."""
        return self.split_projection(self.in_proj(x))

    def split_projection(self, proj: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Split the projection into heads.

        Args:
            proj: ``(B, H, W, 4C)``, ``in_proj``'s output.

        Returns:
            tuple: ``q, k, v`` each ``(B, h, N, d)`` with ``N = H * W`` (row-major)
            and channel ``c`` in head ``c // d``; ``gate`` ``(B, H, W, C)``; and
            ``v_image`` ``(B, C, H, W)``, the values as an image for the LePE.
        """
        B, H, W, _ = proj.shape
        q, k, v, gate = proj.chunk(4, dim=-1)

        def heads(t):
            return t.reshape(B, H * W, self.num_heads, self.head_dim).transpose(1, 2)

        return heads(q), heads(k), heads(v), gate, v.permute(0, 3, 1, 2)


class PolaLinearAttention(GatedAttention):
    """Polarity-aware linear attention with channel-wise spiky feature maps.

    Learnable temperatures ``temp_same``/``temp_opp`` ``(h, 2d)`` are stored as
    logits (initialised to 0) and used through a sigmoid. A 2-D RoPE over the
    token grid rotates the 2d-channel feature maps in the numerator.

    Args:
        embed_dims (int): channels C.
        num_heads (int): heads h; the head dim ``C / h`` must be even.
        use_rope (bool): rotate the numerator's feature maps. Default True.
        backend (str): :func:`~polaformerpp.ops.pola_attention` backend. Default ``'auto'``.
        lepe_kernel_size (int): kernel of the depthwise LePE conv. Default 5.
    """

    def __init__(self, embed_dims: int, num_heads: int, use_rope: bool = True,
                 backend: str = 'auto', lepe_kernel_size: int = 5):
        super().__init__(embed_dims, num_heads, lepe_kernel_size)
        if self.head_dim % 2 != 0:
            raise ValueError(f'the head dim embed_dims / num_heads = {self.head_dim} must be even '
                             f'for the polarity split of the values')
        self.use_rope = use_rope
        self.backend = backend
        self.temp_same = nn.Parameter(torch.zeros(num_heads, 2 * self.head_dim))
        self.temp_opp = nn.Parameter(torch.zeros(num_heads, 2 * self.head_dim))

    def attention(self, q: Tensor, k: Tensor, v: Tensor, height: int, width: int) -> Tensor:
        rope = RopeGrid(height, width) if self.use_rope else None
        return pola_attention(q, k, v, self.temp_same.sigmoid(), self.temp_opp.sigmoid(), rope=rope,
                              backend=self.backend)


class RoPESoftmaxAttention(GatedAttention):
    """Softmax attention with a 2-D RoPE on q and k (the late stages' "v" blocks).

    Args:
        embed_dims (int): channels C.
        num_heads (int): heads h; the head dim must be a multiple of 4 (2-D RoPE).
        use_rope (bool): rotate q and k. Default True.
        lepe_kernel_size (int): kernel of the depthwise LePE conv. Default 5.
    """

    def __init__(self, embed_dims: int, num_heads: int, use_rope: bool = True,
                 lepe_kernel_size: int = 5):
        super().__init__(embed_dims, num_heads, lepe_kernel_size)
        if use_rope and self.head_dim % 4 != 0:
            raise ValueError(f'the head dim embed_dims / num_heads = {self.head_dim} must be a '
                             f'multiple of 4 for the 2-D RoPE of softmax attention')
        self.use_rope = use_rope

    def attention(self, q: Tensor, k: Tensor, v: Tensor, height: int, width: int) -> Tensor:
        if self.use_rope:
            q, k = apply_rope_2d(height, width, q, k)
        return F.scaled_dot_product_attention(q, k, v)


def build_token_mixer(attn_type: str, embed_dims: int, num_heads: int, backend: str = 'auto') -> nn.Module:
    """``'linear'`` -> :class:`PolaLinearAttention`, ``'softmax'`` -> :class:`RoPESoftmaxAttention`."""
    if attn_type == 'linear':
        return PolaLinearAttention(embed_dims, num_heads, backend=backend)
    if attn_type == 'softmax':
        return RoPESoftmaxAttention(embed_dims, num_heads)
    raise ValueError(f"attn_type must be 'linear' or 'softmax', got {attn_type!r}")
