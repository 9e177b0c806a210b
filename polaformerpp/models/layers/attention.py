"""Token mixers of PolaFormer++: polarity-aware linear attention and RoPE softmax attention.

Both take and return channels-last feature maps ``(B, H, W, C)`` and share one
layout: a single ``in_proj = Linear(C, 4C)`` producing ``[q | k | v | gate]``,
a 5x5 depthwise LePE on ``v`` added to the attention output, the gate
multiplied in, and an output ``proj = Linear(C, C)``. The activations stay in
that token layout throughout: q, k and the gate are strided views of the
projection's output, the LePE convolution runs on channels-last memory and
returns tokens, and the linear attention writes its output, LePE added and
gate multiplied, straight into the tokens ``proj`` reads
(:func:`~polaformerpp.ops.pola_attention_gated`). (The authors name the
input projection ``qkvg`` in linear and ``qkvo`` in softmax blocks; the
checkpoint converter maps both to ``in_proj``.)
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from polaformerpp.ops import RopeGrid, gated_output, pola_attention_gated
from polaformerpp.ops.depthwise import depthwise_conv2d
from polaformerpp.ops.pola_attention.common import as_rope_halves
from polaformerpp.ops.pola_attention.cpu import exponent_shift_needed
from polaformerpp.ops.rope import apply_rope_2d

from .fused import linear_act
from .linear_attention_cpu import PolaLinearAttentionCPU, fused_training_applies

#: the attention's denominator epsilon (the op's default)
DEFAULT_EPS = 1e-6

__all__ = ['GatedAttention', 'PolaLinearAttention', 'RoPESoftmaxAttention', 'build_token_mixer']


class GatedAttention(nn.Module):
    """Projections shared by both token mixers: ``in_proj``, ``lepe`` and ``proj``.

    Subclasses implement :meth:`features` as ``split_heads`` -> attention over
    the heads, plus ``lepe_tokens``, times the gate; ``forward`` applies ``proj``
    to them (a block may instead fold ``proj`` into its residual).

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
        """``(B, H, W, C) -> (B, H, W, C)``: ``proj`` of :meth:`features`."""
        B, H, W, C = x.shape
        return linear_act(self.proj, None, self.features(x)).view(B, H, W, C)

    def features(self, x: Tensor) -> Tensor:
        """``(B, H, W, C) -> (B, N, C)``: the gated attention output, what ``proj`` reads."""
        raise NotImplementedError

    def split_heads(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Project ``x`` and split it into heads: :meth:`split_projection` of ``in_proj(x)``."""
        return self.split_projection(linear_act(self.in_proj, None, x))

    def split_projection(self, proj: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Split the projection into heads (views, no copies but ``v``'s).

        Args:
            proj: ``(B, H, W, 4C)``, ``in_proj``'s output.

        Returns:
            tuple: ``q, k, v`` each ``(B, h, N, d)`` with ``N = H * W`` (row-major)
            and channel ``c`` in head ``c // d``; ``gate`` ``(B, H, W, C)``; and
            ``v_image`` ``(B, C, H, W)`` in channels-last memory, the values as
            an image for the LePE (the one copy: a depthwise convolution reads
            dense channels-last memory).
        """
        B, H, W, _ = proj.shape
        q, k, v, gate = proj.chunk(4, dim=-1)
        v = v.contiguous()
        v_image = v.permute(0, 3, 1, 2)

        def heads(t):
            return t.reshape(B, H * W, self.num_heads, self.head_dim).transpose(1, 2)

        return heads(q), heads(k), heads(v), gate, v_image

    def lepe_tokens(self, v_image: Tensor) -> Tensor:
        """The LePE term in the token layout: ``(B, C, H, W)`` (channels-last) ``-> (B, N, C)``."""
        B, C, H, W = v_image.shape
        lepe = depthwise_conv2d(v_image, self.lepe.weight, self.lepe.bias)
        return lepe.permute(0, 2, 3, 1).reshape(B, H * W, C)


class PolaLinearAttention(GatedAttention):
    """Polarity-aware linear attention with channel-wise spiky feature maps.

    Learnable temperatures ``temp_same``/``temp_opp`` ``(h, 2d)`` are stored as
    logits (initialised to 0) and used through a sigmoid. A 2-D RoPE over the
    token grid rotates the 2d-channel feature maps in the numerator.

    Args:
        embed_dims (int): channels C.
        num_heads (int): heads h; the head dim ``C / h`` must be even.
        use_rope (bool): rotate the numerator's feature maps. Default True.
        backend (str): :func:`pola_attention` backend. Default ``'auto'``.
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

    def features(self, x: Tensor) -> Tensor:
        """``(B, H, W, C) -> (B, N, C)``."""
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
        """The step from the projection to ``(B, N, C)`` as one Function
        (:class:`~.linear_attention_cpu.PolaLinearAttentionCPU`); None for inputs that
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

    def features(self, x: Tensor) -> Tensor:
        """``(B, H, W, C) -> (B, N, C)``."""
        B, H, W, C = x.shape
        q, k, v, gate, v_image = self.split_heads(x)
        if self.use_rope:
            q, k = apply_rope_2d(H, W, q, k)
        out = F.scaled_dot_product_attention(q, k, v)
        lepe, gate = self.lepe_tokens(v_image), gate.reshape(B, H * W, C)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (out, lepe, gate)):
            return gated_output(out, lepe, gate)
        # in place on the conv's fresh output, in the token layout (sdpa's backward would need its output)
        lepe.view(B, H * W, self.num_heads, self.head_dim).add_(out.transpose(1, 2))
        return lepe.mul_(gate)


def build_token_mixer(attn_type: str, embed_dims: int, num_heads: int, backend: str = 'auto') -> nn.Module:
    """``'linear'`` -> :class:`PolaLinearAttention`, ``'softmax'`` -> :class:`RoPESoftmaxAttention`."""
    if attn_type == 'linear':
        return PolaLinearAttention(embed_dims, num_heads, backend=backend)
    if attn_type == 'softmax':
        return RoPESoftmaxAttention(embed_dims, num_heads)
    raise ValueError(f"attn_type must be 'linear' or 'softmax', got {attn_type!r}")
