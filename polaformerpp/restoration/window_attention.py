"""Shifted-window softmax attention with a relative position bias, for any H and W.

The feature map is zero-padded at the bottom/right to a multiple of the window
size; padded tokens are masked out as keys (so the result never depends on the
padding) and removed from the output. In a shifted layer the map is rolled by
``-shift`` on both axes and tokens that wrapped around only attend within their
own region, as in Swin Transformer.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from polaformerpp.ops.tracing import is_tracing

__all__ = ['relative_position_index', 'padded_size', 'window_partition', 'window_merge', 'ShiftedWindowAttention']

_MASKED = -1e4  # additive logit for forbidden (query, key) pairs; finite, fp16-safe


def relative_position_index(window: int) -> Tensor:
    """``(w*w, w*w)`` long: index into a ``(2w-1)^2`` bias table for each token pair of a window."""
    coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing='ij'))
    coords = coords.flatten(1)  # (2, w*w)
    rel = (coords[:, :, None] - coords[:, None, :]) + (window - 1)  # (2, n, n) in [0, 2w-2]
    return rel[0] * (2 * window - 1) + rel[1]


def window_partition(x: Tensor, window: int) -> Tensor:
    """``(B, H, W, C) -> (B, nW, w*w, C)`` with ``nW = (H/w)(W/w)``; H, W multiples of w."""
    B, H, W, C = x.shape
    x = x.reshape(B, H // window, window, W // window, window, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(B, -1, window * window, C)


def window_merge(windows: Tensor, window: int, height: int, width: int) -> Tensor:
    """Inverse of :func:`window_partition`: ``(B, nW, w*w, C) -> (B, H, W, C)``."""
    B, _, _, C = windows.shape
    x = windows.reshape(B, height // window, width // window, window, window, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(B, height, width, C)


def padded_size(size: int, window: int) -> int:
    """``size`` rounded up to a multiple of ``window``, written as ``windows * window``.

    (The product form keeps traced sizes simple: the windows of a padded side
    are ``padded // window`` exactly, which the tracer can prove.)
    """
    return (size + window - 1) // window * window


def _window_mask(height: int, width: int, window: int, shift: int, device) -> Tensor:
    """Additive ``(nW, 1, n, n)`` mask over the padded, rolled map, or ``None`` if nothing is masked.

    A (query, key) pair is allowed when both lie in the same wrap-around
    region and the key is a real (not padded) token. Under tracing (export,
    torch.compile) the mask is always built (all zeros when nothing is
    masked), so the graph does not depend on whether the size is a multiple
    of the window.
    """
    hp, wp = padded_size(height, window), padded_size(width, window)
    if shift == 0 and not is_tracing() and hp == height and wp == width:
        return None
    rows = torch.arange(hp, device=device)
    cols = torch.arange(wp, device=device)
    # region label: 1 for the first `shift` rows/cols (they wrap to the end when rolled)
    region = ((rows < shift).long()[:, None] * 2 + (cols < shift).long()[None, :])
    valid = (rows < height)[:, None] & (cols < width)[None, :]
    if shift:
        region = torch.roll(region, (-shift, -shift), dims=(0, 1))
        valid = torch.roll(valid, (-shift, -shift), dims=(0, 1))
    region = window_partition(region[None, :, :, None], window)[0, :, :, 0]  # (nW, n)
    valid = window_partition(valid[None, :, :, None], window)[0, :, :, 0]
    allowed = (region[:, :, None] == region[:, None, :]) & valid[:, None, :]
    mask = torch.zeros(allowed.shape, device=device)
    return mask.masked_fill_(~allowed, _MASKED)[:, None]


class ShiftedWindowAttention(nn.Module):
    """Multi-head softmax attention in (shifted) square windows, on channels-last maps.

    ``Linear(C, 3C)`` -> q, k, v; ``softmax(q k^T / sqrt(d) + bias) v`` per
    window, with a learnable bias per head and relative offset
    (``(2w-1)^2 x heads`` table); ``Linear(C, C)``.

    Args:
        embed_dims (int): channels C.
        num_heads (int): heads; ``C % num_heads == 0``.
        window_size (int): window side w.
        shift_size (int): roll of the map before partitioning, ``0 <= shift < w``.
        qkv_bias (bool): bias of the qkv projection.
    """

    def __init__(self, embed_dims: int, num_heads: int, window_size: int = 16,
                 shift_size: int = 0, qkv_bias: bool = True):
        super().__init__()
        if num_heads < 1 or embed_dims % num_heads != 0:
            raise ValueError(f'embed_dims ({embed_dims}) must be divisible by num_heads ({num_heads})')
        if window_size < 1 or not 0 <= shift_size < window_size:
            raise ValueError(f'need window_size >= 1 and 0 <= shift_size < window_size, got '
                             f'window_size={window_size}, shift_size={shift_size}')
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.window_size = window_size
        self.shift_size = shift_size
        self.qkv = nn.Linear(embed_dims, 3 * embed_dims, bias=qkv_bias)
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window_size - 1) ** 2, num_heads))
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)
        self.register_buffer('relative_position_index', relative_position_index(window_size),
                             persistent=False)
        self.proj = nn.Linear(embed_dims, embed_dims)

    def relative_position_bias(self) -> Tensor:
        """``(heads, n, n)`` with ``n = w*w``."""
        n = self.window_size ** 2
        bias = self.relative_position_bias_table[self.relative_position_index.reshape(-1)]
        return bias.reshape(n, n, self.num_heads).permute(2, 0, 1)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, H, W, C) -> (B, H, W, C)`` for any H, W >= 1."""
        B, H, W, C = x.shape
        w, s, h = self.window_size, self.shift_size, self.num_heads
        Hp, Wp = padded_size(H, w), padded_size(W, w)
        qkv = F.pad(self.qkv(x), (0, 0, 0, Wp - W, 0, Hp - H))  # (B, Hp, Wp, 3C)
        if s:
            qkv = torch.roll(qkv, (-s, -s), dims=(1, 2))
        windows = window_partition(qkv, w)  # (B, nW, n, 3C)
        nW, n = windows.shape[1:3]
        # the windows ride along the heads: 4-D attention, which every exporter translates
        q, k, v = windows.reshape(B, nW, n, 3, h, C // h).permute(3, 0, 1, 4, 2, 5).flatten(2, 3)  # (B, nW h, n, d)

        bias = self.relative_position_bias().to(q.dtype)  # (h, n, n)
        mask = _window_mask(H, W, w, s, x.device)
        bias = bias.expand(nW, h, n, n) if mask is None else bias + mask.to(q.dtype)  # (nW, h, n, n)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.reshape(nW * h, n, n))  # (B, nW h, n, d)
        out = out.unflatten(1, (nW, h))  # (B, nW, h, n, d)

        out = window_merge(out.transpose(2, 3).reshape(B, nW, n, C), w, Hp, Wp)
        if s:
            out = torch.roll(out, (s, s), dims=(1, 2))
        # cropped by a negative pad: a fresh tensor, where a slice's layout (contiguous exactly
        # when nothing was padded) would fix the traced width to a multiple or not of the window
        return self.proj(F.pad(out, (0, 0, 0, W - Wp, 0, H - Hp)))
