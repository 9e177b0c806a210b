"""PolaFormer++ backbone (b0-b5): one class for classification and dense prediction."""
import copy
from typing import Dict, List, Sequence, Union

import torch
import torch.nn as nn
import torch.utils.checkpoint as cp
from mmengine.model import BaseModule
from mmengine.registry import MODELS
from torch import Tensor

from polaformerpp.ops.fusion import fuse_modules

from ..layers import ChannelLayerNorm, ConvBN, PolaFormerBlock, Stem

__all__ = ['PolaFormerPP']

ATTN_TYPES = ('linear', 'softmax')
#: the authors' released layout: linear attention in stages 1-2, softmax in 3-4
RELEASED_ATTN_TYPES = ('linear', 'linear', 'softmax', 'softmax')
CLS_PROJ_INDEX = 4


class PolaFormerStage(nn.Module):
    """Blocks of one resolution, then (except in the last stage) a stride-2 conv+BN downsample.

    ``forward`` takes tokens ``(B, H, W, C)`` and returns ``(stage output
    before downsampling, input of the next stage)``, both tokens.
    """

    def __init__(self, embed_dims: int, depth: int, num_heads: int, attn_type: str,
                 mlp_ratio: float, drop_paths: Sequence[float], layer_scale_init_value: float,
                 out_dims: Union[int, None], attn_backend: str, with_cp: bool = False):
        super().__init__()
        self.blocks = nn.ModuleList([
            PolaFormerBlock(embed_dims, num_heads, attn_type, mlp_ratio, drop_paths[i],
                            layer_scale_init_value, attn_backend) for i in range(depth)
        ])
        self.downsample = ConvBN(embed_dims, out_dims, stride=2) if out_dims else None
        self.with_cp = with_cp

    def forward(self, x: Tensor):
        for block in self.blocks:
            if self.with_cp and x.requires_grad:
                x = cp.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        if self.downsample is None:
            return x, x
        return x, self.downsample(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


@MODELS.register_module()
class PolaFormerPP(BaseModule):
    """PolaFormer++: hierarchical vision transformer with polarity-aware linear attention.

    A 4-stage network (strides 4/8/16/32). Stages use polarity-aware linear
    attention or RoPE softmax attention per ``attn_types`` (default: linear in
    stages 1-2, softmax in 3-4, as released).

    Output indices 0-3 are the four stage outputs (before downsampling), each
    through its own channel LayerNorm ``norm{i}``: ``(B, C_i, H/2^(i+2), W/2^(i+2))``,
    for detection and segmentation. Index 4 is the classification projection
    ``cls_proj`` (1x1 conv ``C_4 -> P`` + BN + Swish): ``(B, P, H/32, W/32)``;
    with ``GlobalAveragePooling`` and ``LinearClsHead`` it is the authors'
    classifier. Any input size works (every stride-2 conv pads by 1).

    Args:
        arch (str | dict): ``'b0'``...``'b5'`` or a dict with ``embed_dims``,
            ``depths``, ``num_heads`` (and optionally ``drop_path_rate``,
            ``cls_proj_channels``, ``layer_scale_init_values``).
        in_channels (int): input image channels. Default 3.
        out_indices (Sequence[int]): outputs to return, in ``[0, 4]``. Default ``(4,)``.
        attn_types (Sequence[str]): ``'linear'``/``'softmax'`` per stage.
        drop_path_rate (float, optional): stochastic depth, linear over all blocks.
            Defaults to the arch's value.
        layer_scale_init_values (Sequence[float], optional): per stage. Defaults to the arch's.
        mlp_ratio (float): FFN expansion. Default 3.5.
        frozen_stages (int): -1 freezes nothing, 0 the stem, ``i >= 1`` the stem
            and stages ``0..i-1`` (with their downsample and output norm).
        norm_eval (bool): keep BatchNorm layers in eval mode while training.
        attn_backend (str): backend of :func:`pola_attention`. Default ``'auto'``.
        with_cp (bool): gradient checkpointing per block.
        fused (bool): run the fused forms of the layers
            (:func:`polaformerpp.ops.fusion.fuse_modules`: same parameters and
            outputs, faster on the CPU); False keeps the plain modules. Default True.
        init_cfg (dict, optional): e.g. ``dict(type='Pretrained', checkpoint=..., prefix='backbone.')``.
    """

    arch_zoo: Dict[str, dict] = {
        'b0': dict(embed_dims=[32, 64, 128, 384], depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 12],
                   drop_path_rate=0.1, cls_proj_channels=2048, layer_scale_init_values=[1, 1, 1, 1]),
        'b1': dict(embed_dims=[32, 64, 192, 384], depths=[2, 2, 4, 2], num_heads=[1, 2, 6, 12],
                   drop_path_rate=0.1, cls_proj_channels=2048, layer_scale_init_values=[1, 1, 1, 1]),
        'b2': dict(embed_dims=[64, 128, 256, 512], depths=[2, 2, 6, 2], num_heads=[1, 2, 4, 8],
                   drop_path_rate=0.1, cls_proj_channels=2048, layer_scale_init_values=[1, 1, 1, 1]),
        'b3': dict(embed_dims=[64, 128, 320, 512], depths=[3, 5, 9, 3], num_heads=[1, 2, 5, 8],
                   drop_path_rate=0.15, cls_proj_channels=2048, layer_scale_init_values=[1, 1, 1, 1]),
        'b4': dict(embed_dims=[96, 192, 384, 512], depths=[4, 6, 12, 6], num_heads=[1, 2, 6, 8],
                   drop_path_rate=0.4, cls_proj_channels=2048,
                   layer_scale_init_values=[1, 1, 1e-6, 1e-6]),
        'b5': dict(embed_dims=[96, 192, 448, 640], depths=[4, 7, 19, 8], num_heads=[1, 2, 7, 10],
                   drop_path_rate=0.55, cls_proj_channels=2560,
                   layer_scale_init_values=[1e-6, 1e-6, 1e-6, 1e-6]),
    }

    def __init__(self,
                 arch: Union[str, dict] = 'b0',
                 in_channels: int = 3,
                 out_indices: Sequence[int] = (CLS_PROJ_INDEX, ),
                 attn_types: Sequence[str] = RELEASED_ATTN_TYPES,
                 drop_path_rate: Union[float, None] = None,
                 layer_scale_init_values: Union[Sequence[float], None] = None,
                 mlp_ratio: float = 3.5,
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 attn_backend: str = 'auto',
                 with_cp: bool = False,
                 fused: bool = True,
                 init_cfg: Union[dict, List[dict], None] = None):
        super().__init__(init_cfg=init_cfg)
        self.arch_settings = self._resolve_arch(arch)
        embed_dims = self.arch_settings['embed_dims']
        depths = self.arch_settings['depths']
        num_heads = self.arch_settings['num_heads']
        if drop_path_rate is None:
            drop_path_rate = self.arch_settings.get('drop_path_rate', 0.0)
        if layer_scale_init_values is None:
            layer_scale_init_values = self.arch_settings.get('layer_scale_init_values', [1.0] * 4)
        cls_proj_channels = self.arch_settings.get('cls_proj_channels', 2048)

        attn_types = tuple(attn_types)
        if len(attn_types) != 4 or any(t not in ATTN_TYPES for t in attn_types):
            raise ValueError(f'attn_types must be 4 entries from {ATTN_TYPES}, got {attn_types}')
        if len(layer_scale_init_values) != 4:
            raise ValueError(f'layer_scale_init_values must have 4 entries, got {layer_scale_init_values}')
        if isinstance(out_indices, int):
            out_indices = (out_indices, )
        out_indices = tuple(sorted(i % 5 if i < 0 else i for i in out_indices))
        if not out_indices or any(not 0 <= i <= CLS_PROJ_INDEX for i in out_indices):
            raise ValueError(f'out_indices must be a non-empty subset of 0..4 (0-3 stage outputs, '
                             f'4 the classification projection), got {out_indices}')
        if not -1 <= frozen_stages <= 4:
            raise ValueError(f'frozen_stages must be in [-1, 4], got {frozen_stages}')
        if in_channels < 1:
            raise ValueError(f'in_channels must be positive, got {in_channels}')

        self.in_channels = in_channels
        self.embed_dims = list(embed_dims)
        self.attn_types = attn_types
        self.out_indices = out_indices
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval

        self.stem = Stem(in_channels, embed_dims[0])
        total_depth = sum(depths)
        drop_paths = torch.linspace(0, drop_path_rate, total_depth).tolist()
        self.stages = nn.ModuleList()
        start = 0
        for i in range(4):
            self.stages.append(
                PolaFormerStage(
                    embed_dims[i], depths[i], num_heads[i], attn_types[i], mlp_ratio,
                    drop_paths[start:start + depths[i]], layer_scale_init_values[i],
                    embed_dims[i + 1] if i < 3 else None, attn_backend, with_cp))
            start += depths[i]
        for i in out_indices:
            if i < CLS_PROJ_INDEX:
                self.add_module(f'norm{i}', ChannelLayerNorm(embed_dims[i], eps=1e-6))
        if CLS_PROJ_INDEX in out_indices:
            self.cls_proj = nn.Sequential()
            self.cls_proj.add_module('conv', nn.Conv2d(embed_dims[3], cls_proj_channels, 1))
            self.cls_proj.add_module('bn', nn.BatchNorm2d(cls_proj_channels))
            self.cls_proj.add_module('act', nn.SiLU())
        self.num_features = [*embed_dims, cls_proj_channels]
        self._freeze_stages()
        if fused:
            fuse_modules(self)

    def _resolve_arch(self, arch) -> dict:
        if isinstance(arch, str):
            if arch.lower() not in self.arch_zoo:
                raise ValueError(f'arch must be one of {sorted(self.arch_zoo)} or a dict, got {arch!r}')
            return copy.deepcopy(self.arch_zoo[arch.lower()])
        if isinstance(arch, dict):
            required = {'embed_dims', 'depths', 'num_heads'}
            missing = required - set(arch)
            if missing:
                raise ValueError(f'a custom arch dict needs the keys {sorted(required)}, missing {sorted(missing)}')
            for key in required:
                if len(arch[key]) != 4:
                    raise ValueError(f'arch[{key!r}] must have 4 entries (one per stage), got {arch[key]}')
            for dims, heads in zip(arch['embed_dims'], arch['num_heads']):
                if dims % heads != 0:
                    raise ValueError(f'arch embed_dims {arch["embed_dims"]} must be divisible by '
                                     f'num_heads {arch["num_heads"]} stage by stage')
            return copy.deepcopy(arch)
        raise TypeError(f'arch must be a str or dict, got {type(arch).__name__}')

    def init_weights(self):
        """Truncated-normal (std 0.02) conv weights and zero conv biases, or the ``init_cfg`` checkpoint."""
        if self.init_cfg is not None:
            super().init_weights()
            return
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        self._is_init = True

    def forward(self, x: Tensor):
        """``(B, in_channels, H, W)`` -> tuple of the outputs in ``out_indices``."""
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f'PolaFormerPP expects input of shape (B, {self.in_channels}, H, W), '
                             f'got {tuple(x.shape)}')
        outs = []
        x = self.stem(x).permute(0, 2, 3, 1)  # tokens (B, H, W, C) from the stem on
        for i, stage in enumerate(self.stages):
            feat, x = stage(x)
            if i in self.out_indices:
                outs.append(getattr(self, f'norm{i}')(feat))
        if CLS_PROJ_INDEX in self.out_indices:
            outs.append(self.cls_proj(feat.permute(0, 3, 1, 2)))
        return tuple(outs)

    def _freeze_stages(self):
        if self.frozen_stages < 0:
            return
        frozen = [self.stem] + [self.stages[i] for i in range(min(self.frozen_stages, 4))]
        frozen += [getattr(self, f'norm{i}') for i in range(min(self.frozen_stages, 4))
                   if hasattr(self, f'norm{i}')]
        for module in frozen:
            module.eval()
            for param in module.parameters():
                param.requires_grad = False

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.eval()
        return self
