"""DiT, the Diffusion Transformer, with PolaFormer++ linear attention in every block.

``DiT(x, t, y)``: a noisy image or latent ``x (B, in_ch, H, W)``, timesteps
``t (B,)`` and class labels ``y (B,)`` -> ``(B, out_ch, H, W)`` where
``out_ch = 2 * in_ch`` with a learned variance (``[eps | v]``) or ``in_ch``.

Sizes (depth / width / heads) S 12/384/6, B 12/768/12, L 24/1024/16,
XL 28/1152/16, each with patch 2, 4 or 8, registered in mmengine's root
``MODELS`` as ``'DiT-S/2'`` ... ``'DiT-XL/8'`` (functions returning a
:class:`DiT`) besides the class ``'DiT'`` itself (``arch='DiT-S/2'`` or a dict).
"""
from typing import Dict, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.registry import MODELS
from torch import Tensor

from polaformerpp.ops.fusion import fuse_modules

from . import fused_layers  # noqa: F401  (registers the token attention's fused form)
from .dit_layers import (
    ATTENTION_TYPES,
    DiTBlock,
    FinalLayer,
    LabelEmbedder,
    PatchEmbed,
    TimestepEmbedder,
    sincos_pos_embed_2d,
)

__all__ = ['DiT', 'DIT_SIZES', 'DIT_ARCHS', 'build_dit', 'dit_param_count']

#: depth, hidden size (width), heads of each DiT size.
DIT_SIZES: Dict[str, Dict[str, int]] = {
    'S': dict(depth=12, hidden_size=384, num_heads=6),
    'B': dict(depth=12, hidden_size=768, num_heads=12),
    'L': dict(depth=24, hidden_size=1024, num_heads=16),
    'XL': dict(depth=28, hidden_size=1152, num_heads=16),
}

#: every registered name, e.g. ``'DiT-XL/2'`` -> depth, hidden_size, num_heads, patch_size.
DIT_ARCHS: Dict[str, Dict[str, int]] = {
    f'DiT-{size}/{patch}': dict(spec, patch_size=patch)
    for size, spec in DIT_SIZES.items() for patch in (2, 4, 8)
}

_ARCH_KEYS = ('depth', 'hidden_size', 'num_heads', 'patch_size')


def _resolve_arch(arch: Union[str, dict]) -> Dict[str, int]:
    if isinstance(arch, str):
        if arch not in DIT_ARCHS:
            raise ValueError(f'unknown DiT arch {arch!r}; choose one of {sorted(DIT_ARCHS)} '
                             f'or pass a dict with keys {_ARCH_KEYS}')
        return dict(DIT_ARCHS[arch])
    if isinstance(arch, dict):
        missing = [k for k in _ARCH_KEYS if k not in arch]
        extra = [k for k in arch if k not in _ARCH_KEYS]
        if missing or extra:
            raise ValueError(f'arch dict needs exactly the keys {_ARCH_KEYS}; missing {missing}, '
                             f'unexpected {extra}')
        return {k: int(arch[k]) for k in _ARCH_KEYS}
    raise TypeError(f'arch must be a DiT name such as "DiT-S/2" or a dict, got {type(arch).__name__}')


def _pair(size: Union[int, Sequence[int]], name: str) -> Tuple[int, int]:
    if isinstance(size, int):
        size = (size, size)
    if len(size) != 2 or any(not isinstance(s, int) or s < 1 for s in size):
        raise ValueError(f'{name} must be a positive int or (height, width), got {size!r}')
    return tuple(size)


@MODELS.register_module()
class DiT(nn.Module):
    """Class-conditional Diffusion Transformer (adaLN-Zero) with a choice of attention.

    Args:
        arch (str | dict): ``'DiT-S/2'`` ... ``'DiT-XL/8'``, or a dict with
            ``depth``, ``hidden_size``, ``num_heads``, ``patch_size``.
        input_size (int | tuple): spatial size of ``x`` (latent: image / 8).
        in_channels (int): 4 for SD-VAE latents, 3 for pixels.
        num_classes (int): class labels ``0 .. num_classes - 1``.
        class_dropout_prob (float): training-time label dropout (classifier-free
            guidance); 0 disables the null class.
        learn_sigma (bool): also predict the interpolation ``v`` of the variance,
            doubling the output channels.
        attn_type (str): ``'linear'`` (PolaFormer++ linear attention, default) or
            ``'softmax'`` (the original DiT attention).
        mlp_ratio (float): MLP hidden width over ``hidden_size``.
        attn_backend (str): :func:`polaformerpp.ops.pola_attention` backend.
        label_embed_std (float): std of the normal init of the label table.
            DiT's 0.02 (the default, as published) gives label rows of norm
            ``0.02 * sqrt(hidden_size)`` next to a timestep embedding that Adam
            grows to a norm of 10-50 within the first 1,000 steps: the label is
            then ~1% of the condition ``c`` and a short run does not learn to
            use it (a label-swap gap of ~0, see
            :func:`~polaformerpp.generation.label_swap_gap`). ``1.0`` (ADM's,
            and PyTorch's default for an embedding) makes the two comparable
            from the first step: the CPU demos use it.
        fused (bool): run the fused forms of the PolaFormer++ attention layers
            (:func:`polaformerpp.ops.fusion.fuse_modules`: same parameters and
            outputs, faster on the CPU); False keeps the plain modules. Default True.
    """

    def __init__(self, arch: Union[str, dict] = 'DiT-S/2', input_size: Union[int, Sequence[int]] = 32,
                 in_channels: int = 4, num_classes: int = 1000, class_dropout_prob: float = 0.1,
                 learn_sigma: bool = True, attn_type: str = 'linear', mlp_ratio: float = 4.0,
                 attn_backend: str = 'auto', label_embed_std: float = 0.02, fused: bool = True):
        super().__init__()
        spec = _resolve_arch(arch)
        if not 0 < label_embed_std < float('inf'):
            raise ValueError(f'label_embed_std must be a positive number, got {label_embed_std}')
        self.label_embed_std = float(label_embed_std)
        if attn_type not in ATTENTION_TYPES:
            raise ValueError(f'attn_type must be one of {ATTENTION_TYPES}, got {attn_type!r}')
        self.input_size = _pair(input_size, 'input_size')
        patch = spec['patch_size']
        if any(s % patch for s in self.input_size):
            raise ValueError(f'input_size {self.input_size} must be divisible by the patch size '
                             f'{patch} of the arch (image or latent size not divisible by the patch)')
        if spec['hidden_size'] % spec['num_heads']:
            raise ValueError(f"hidden_size ({spec['hidden_size']}) must be divisible by num_heads "
                             f"({spec['num_heads']})")
        if num_classes < 1:
            raise ValueError(f'num_classes must be >= 1, got {num_classes}')
        self.arch = spec
        self.patch_size = patch
        self.in_channels = in_channels
        self.out_channels = 2 * in_channels if learn_sigma else in_channels
        self.learn_sigma = learn_sigma
        self.num_classes = num_classes
        self.attn_type = attn_type
        self.grid = (self.input_size[0] // patch, self.input_size[1] // patch)
        hidden = spec['hidden_size']

        self.x_embedder = PatchEmbed(patch, in_channels, hidden)
        self.t_embedder = TimestepEmbedder(hidden)
        self.y_embedder = LabelEmbedder(num_classes, hidden, class_dropout_prob)
        # fixed, not trained; saved with the weights like DiT's frozen parameter
        self.register_buffer('pos_embed', torch.zeros(1, self.grid[0] * self.grid[1], hidden))
        self.blocks = nn.ModuleList([
            DiTBlock(hidden, spec['num_heads'], mlp_ratio, attn_type, attn_backend)
            for _ in range(spec['depth'])
        ])
        self.final_layer = FinalLayer(hidden, patch, self.out_channels)
        self._init_weights()
        if fused:
            fuse_modules(self)

    @property
    def null_class(self) -> int:
        """Label of the unconditional branch for classifier-free guidance."""
        return self.y_embedder.null_class

    def _init_weights(self) -> None:
        """DiT's initialisation: Xavier linears, N(0, 0.02) embedders (the label table:
        ``label_embed_std``), zero adaLN and output, fixed sin-cos positions."""
        def xavier(module):
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

        self.apply(xavier)
        with torch.no_grad():
            self.pos_embed.copy_(
                sincos_pos_embed_2d(self.arch['hidden_size'], *self.grid).unsqueeze(0))
        w = self.x_embedder.proj.weight
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))
        nn.init.zeros_(self.x_embedder.proj.bias)
        nn.init.normal_(self.y_embedder.embedding_table.weight, std=self.label_embed_std)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        for block in self.blocks:
            nn.init.zeros_(block.adaLN_modulation[-1].weight)
            nn.init.zeros_(block.adaLN_modulation[-1].bias)
        for layer in (self.final_layer.adaLN_modulation[-1], self.final_layer.linear):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def unpatchify(self, x: Tensor) -> Tensor:
        """``(B, N, p*p*out_ch)`` -> ``(B, out_ch, H, W)``."""
        B = x.shape[0]
        (gh, gw), p, c = self.grid, self.patch_size, self.out_channels
        x = x.reshape(B, gh, gw, p, p, c)
        return x.permute(0, 5, 1, 3, 2, 4).reshape(B, c, gh * p, gw * p)

    def forward(self, x: Tensor, t: Tensor, y: Tensor) -> Tensor:
        """Noise (and variance) prediction.

        Args:
            x: ``(B, in_channels, H, W)`` with ``(H, W) == input_size``.
            t: ``(B,)`` timesteps of the training schedule (int or float).
            y: ``(B,)`` int labels in ``[0, num_classes]`` (``num_classes`` = null).

        Returns:
            Tensor: ``(B, out_channels, H, W)``.
        """
        if x.dim() != 4 or x.shape[1] != self.in_channels or tuple(x.shape[2:]) != self.input_size:
            raise ValueError(f'x must have shape (B, {self.in_channels}, {self.input_size[0]}, '
                             f'{self.input_size[1]}), got {tuple(x.shape)}')
        if t.shape != (x.shape[0], ) or y.shape != (x.shape[0], ):
            raise ValueError(f't and y must have shape (B,) = ({x.shape[0]},), '
                             f'got {tuple(t.shape)} and {tuple(y.shape)}')
        tokens = self.x_embedder(x) + self.pos_embed
        c = self.t_embedder(t) + self.y_embedder(y)
        for block in self.blocks:
            tokens = block(tokens, c, self.grid)
        return self.unpatchify(self.final_layer(tokens, c))


def build_dit(name: str, **kwargs) -> DiT:
    """``build_dit('DiT-XL/2', input_size=32, attn_type='softmax')``."""
    return DiT(arch=name, **kwargs)


def _register_arch_names() -> None:
    for name in DIT_ARCHS:
        def builder(_name=name, **kwargs):
            return DiT(arch=_name, **kwargs)

        builder.__name__ = builder.__qualname__ = name.replace('-', '_').replace('/', '_')
        builder.__doc__ = f'``{name}``: :class:`DiT` with arch {DIT_ARCHS[name]}.'
        MODELS.register_module(name=name, module=builder)


_register_arch_names()


def dit_param_count(arch: Union[str, dict], input_size: int = 32, in_channels: int = 4,
                    num_classes: int = 1000, class_dropout_prob: float = 0.1,
                    learn_sigma: bool = True, attn_type: str = 'softmax', mlp_ratio: float = 4.0,
                    include_pos_embed: bool = True) -> int:
    """Closed-form parameter count of a :class:`DiT` (same arguments).

    ``include_pos_embed`` counts the fixed position table like the published
    DiT numbers do (there it is a frozen parameter; here a buffer).
    """
    spec = _resolve_arch(arch)
    C, p, depth, heads = spec['hidden_size'], spec['patch_size'], spec['depth'], spec['num_heads']
    d = C // heads
    out_ch = 2 * in_channels if learn_sigma else in_channels
    mlp = int(C * mlp_ratio)
    if attn_type == 'softmax':
        attn = C * 3 * C + 3 * C + C * C + C
    else:  # 'linear': input projection C -> 4C, 5x5 depthwise LePE, proj, two (h, 2d) temperatures
        attn = C * 4 * C + 4 * C + 25 * C + C + C * C + C + 2 * heads * 2 * d
    block = attn + (C * mlp + mlp + mlp * C + C) + (C * 6 * C + 6 * C)
    total = (in_channels * p * p * C + C  # patch embedding
             + 256 * C + C + C * C + C  # timestep MLP
             + (num_classes + int(class_dropout_prob > 0)) * C  # label table
             + depth * block
             + C * p * p * out_ch + p * p * out_ch + C * 2 * C + 2 * C)  # final layer
    if include_pos_embed:
        total += (input_size // p) ** 2 * C
    return total
