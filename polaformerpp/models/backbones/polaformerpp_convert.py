"""The authors' PolaFormer++ checkpoint layout, mapped to :class:`PolaFormerPP`.

:func:`convert_official_state_dict` turns a state_dict of the authors'
released classifiers into the keys and shapes of this project's mmpretrain
``ImageClassifier`` (``backbone.`` = :class:`PolaFormerPP` with
``out_indices=(4,)``, ``head.fc`` = the linear classifier), and reports what it
did with every key. Everything known about the authors' layout lives here: the
key mapping, the architecture inference from tensor shapes and the check of
their RoPE frequency buffers.

Key mapping (authors' -> project)::

    patch_embed.proj.{0,1,3,4,6,7,9,10}    backbone.stem.{0.conv,0.bn,2.conv,2.bn,4.conv,4.bn,6.conv,6.bn}
    layers.i.blocks.j.pos                  backbone.stages.i.blocks.j.cpe
    layers.i.blocks.j.norm{1,2}.norm       backbone.stages.i.blocks.j.norm{1,2}
    layers.i.blocks.j.attn.qkvg / qkvo     attn.in_proj  (qkvg in linear, qkvo in softmax blocks)
    layers.i.blocks.j.attn.{lepe,proj}     (same names)
    layers.i.blocks.j.attn.s1 / s2 (1,h,1,2d)      attn.temp_same / temp_opp (h,2d)  (logits in both)
    layers.i.blocks.j.gamma_{1,2} (1,C,1,1)        gamma{1,2} (C,)
    layers.i.blocks.j.ffn.{fc1,dwconv,fc2}         (same names)
    layers.i.downsample.{reduction,norm}   backbone.stages.i.downsample.{conv,bn}
    layers.i.RoPE.angle, RoPE_linear.angle dropped (checked, then recomputed by the model)
    proj / norm                            backbone.cls_proj.conv / backbone.cls_proj.bn
    head (K,P,1,1)                         head.fc (K,P)
"""
import re
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from polaformerpp.ops import rope_frequencies

from .polaformerpp import RELEASED_ATTN_TYPES, PolaFormerPP

__all__ = [
    'CheckpointFormatError', 'ConversionReport', 'AUTHORS_QKV_NAMES', 'convert_key', 'official_key',
    'strip_module_prefix', 'infer_arch', 'expected_rope_angle', 'build_classifier',
    'convert_official_state_dict'
]

#: the authors' name of the ``Linear(C, 4C)`` per attention kind (``attn.in_proj`` here)
AUTHORS_QKV_NAMES = {'linear': 'qkvg', 'softmax': 'qkvo'}

# what each ``{field}`` of a key template matches
_FIELDS = dict(
    i=r'\d+', j=r'\d+', n=r'[12]',
    leaf=r'weight|bias|running_mean|running_var|num_batches_tracked',
    param=r'weight|bias',
    qkv='|'.join(AUTHORS_QKV_NAMES.values()),
    attn_part=r'lepe|proj',
    ffn_part=r'fc1|dwconv|fc2',
)
_STEM = {0: '0.conv', 1: '0.bn', 3: '2.conv', 4: '2.bn', 6: '4.conv', 7: '4.bn', 9: '6.conv', 10: '6.bn'}
_BLOCK_SRC = 'layers.{i}.blocks.{j}.'
_BLOCK_DST = 'backbone.stages.{i}.blocks.{j}.'

# (authors' key template, project key template, value transform); the first full match wins
_RULES: List[Tuple[str, str, Optional[str]]] = [
    *[(f'patch_embed.proj.{src}.{{leaf}}', f'backbone.stem.{dst}.{{leaf}}', None)
      for src, dst in _STEM.items()],
    (_BLOCK_SRC + 'pos.{leaf}', _BLOCK_DST + 'cpe.{leaf}', None),
    (_BLOCK_SRC + 'norm{n}.norm.{leaf}', _BLOCK_DST + 'norm{n}.{leaf}', None),
    (_BLOCK_SRC + 'attn.{qkv}.{leaf}', _BLOCK_DST + 'attn.in_proj.{leaf}', None),
    (_BLOCK_SRC + 'attn.{attn_part}.{leaf}', _BLOCK_DST + 'attn.{attn_part}.{leaf}', None),
    (_BLOCK_SRC + 'attn.s1', _BLOCK_DST + 'attn.temp_same', 'temperature'),
    (_BLOCK_SRC + 'attn.s2', _BLOCK_DST + 'attn.temp_opp', 'temperature'),
    (_BLOCK_SRC + 'gamma_{n}', _BLOCK_DST + 'gamma{n}', 'layer_scale'),
    (_BLOCK_SRC + 'ffn.{ffn_part}.{leaf}', _BLOCK_DST + 'ffn.{ffn_part}.{leaf}', None),
    ('layers.{i}.downsample.reduction.{leaf}', 'backbone.stages.{i}.downsample.conv.{leaf}', None),
    ('layers.{i}.downsample.norm.{leaf}', 'backbone.stages.{i}.downsample.bn.{leaf}', None),
    ('proj.{leaf}', 'backbone.cls_proj.conv.{leaf}', None),
    ('norm.{leaf}', 'backbone.cls_proj.bn.{leaf}', None),
    ('head.{param}', 'head.fc.{param}', 'head'),
]
_ROPE_KEY = re.compile(r'layers\.(?P<i>\d+)\.(?P<kind>RoPE|RoPE_linear)\.angle')


def _template_regex(template: str) -> 're.Pattern':
    """``'layers.{i}.pos'`` -> ``re.compile(r'layers\\.(?P<i>\\d+)\\.pos')``."""
    parts = re.split(r'\{(\w+)\}', template)  # literal, field, literal, field, ...
    return re.compile(''.join(re.escape(p) if n % 2 == 0 else f'(?P<{p}>{_FIELDS[p]})'
                              for n, p in enumerate(parts)))


_COMPILED = [(_template_regex(src), src, _template_regex(dst), dst, transform)
             for src, dst, transform in _RULES]


class CheckpointFormatError(ValueError):
    """The file or object is not a PolaFormer++ checkpoint of the authors' layout."""


@dataclass
class ConversionReport:
    """What :func:`convert_official_state_dict` did with every key.

    Attributes:
        arch: the inferred architecture (:func:`infer_arch`).
        mapped: ``(authors' key, project key)`` pairs.
        dropped: ``(authors' key, reason)`` pairs (the RoPE buffers).
        unknown: authors' keys without a mapping rule.
        missing: project keys left unfilled, with the authors' key they come from.
        unexpected: converted keys the project model does not have.
        shape_mismatch: converted tensors whose shape differs from the model's.
        warnings: RoPE buffers that differ from the standard frequencies.
    """
    arch: dict = field(default_factory=dict)
    mapped: List[Tuple[str, str]] = field(default_factory=list)
    dropped: List[Tuple[str, str]] = field(default_factory=list)
    unknown: List[str] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)
    unexpected: List[str] = field(default_factory=list)
    shape_mismatch: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every source key was used and every target key filled with the right shape."""
        return not (self.unknown or self.missing or self.unexpected or self.shape_mismatch)

    def problems(self) -> List[str]:
        """Printable lines naming every unknown, missing, unexpected and mis-shaped key."""
        lines = []
        for title, items in (('unknown source keys (no mapping rule)', self.unknown),
                             ('target keys left unfilled', self.missing),
                             ('converted keys the target model does not have', self.unexpected),
                             ('shape mismatches', self.shape_mismatch)):
            if items:
                lines.append(f'{title} ({len(items)}):')
                lines.extend(f'  {item}' for item in items)
        return lines


# ----------------------------------------------------------------------------- keys
def convert_key(key: str) -> Optional[Tuple[str, Optional[str]]]:
    """Map one authors' key to ``(project key, transform)``; ``None`` when no rule matches."""
    for src_re, _, _, dst, transform in _COMPILED:
        m = src_re.fullmatch(key)
        if m:
            return dst.format(**m.groupdict()), transform
    return None


def official_key(project_key: str, attn_types: Sequence[str] = RELEASED_ATTN_TYPES) -> Optional[str]:
    """The authors' key that :func:`convert_key` maps to ``project_key`` (``None`` if none).

    ``attn_types`` (per stage) picks the authors' name of ``attn.in_proj``:
    ``qkvg`` in linear, ``qkvo`` in softmax stages.
    """
    for _, src, dst_re, _, _ in _COMPILED:
        m = dst_re.fullmatch(project_key)
        if not m:
            continue
        fields = m.groupdict()
        if '{qkv}' in src:
            stage = int(fields['i'])
            if stage >= len(attn_types):
                return None
            fields['qkv'] = AUTHORS_QKV_NAMES[attn_types[stage]]
        key = src.format(**fields)
        hit = convert_key(key)
        if hit is not None and hit[0] == project_key:
            return key
    return None


def strip_module_prefix(state_dict: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """Remove a ``module.`` prefix shared by every key (DataParallel/DDP)."""
    if state_dict and all(k.startswith('module.') for k in state_dict):
        return {k[len('module.'):]: v for k, v in state_dict.items()}
    return state_dict


# ----------------------------------------------------------------------------- architecture
def infer_arch(state_dict: Dict[str, Tensor]) -> dict:
    """Infer the architecture from the shapes of an authors' state_dict.

    Returns:
        dict: ``name`` (``'b0'``...``'b5'`` or ``'custom'``), ``embed_dims``,
        ``depths``, ``num_heads``, ``head_dims``, ``cls_proj_channels``,
        ``num_classes``, ``attn_types``, ``in_channels``, ``mlp_ratio``.

    Raises:
        CheckpointFormatError: the keys do not describe a PolaFormer++ classifier.
    """
    sd = strip_module_prefix(state_dict)

    def need(key):
        if key not in sd:
            raise CheckpointFormatError(f'cannot infer the architecture: missing key {key!r}')
        return sd[key]

    stage_ids = sorted({int(m.group(1)) for k in sd for m in [re.match(r'layers\.(\d+)\.', k)] if m})
    if stage_ids != [0, 1, 2, 3]:
        raise CheckpointFormatError(
            f'expected 4 stages layers.0..layers.3 in the checkpoint, found {stage_ids or "none"} '
            f'(is this a PolaFormer++ classification checkpoint?)')
    qkv_kind = {name: kind for kind, name in AUTHORS_QKV_NAMES.items()}
    embed_dims, depths, num_heads, head_dims, attn_types, hidden = [], [], [], [], [], []
    for i in stage_ids:
        blocks = sorted({int(m.group(1)) for k in sd
                         for m in [re.match(rf'layers\.{i}\.blocks\.(\d+)\.', k)] if m})
        if not blocks or blocks != list(range(len(blocks))):
            raise CheckpointFormatError(f'stage {i}: block indices {blocks} are not 0..n-1')
        dims = need(f'layers.{i}.blocks.0.norm1.norm.weight').shape[0]
        kinds = set()
        for j in blocks:
            found = [name for name in qkv_kind if f'layers.{i}.blocks.{j}.attn.{name}.weight' in sd]
            if len(found) != 1:
                raise CheckpointFormatError(
                    f'block layers.{i}.blocks.{j}: expected exactly one of attn.qkvg (linear) '
                    f'and attn.qkvo (softmax)')
            kinds.add(qkv_kind[found[0]])
        if len(kinds) != 1:
            raise CheckpointFormatError(f'stage {i} mixes linear and softmax blocks; '
                                        f'the project sets the attention type per stage')
        kind = kinds.pop()
        if kind == 'linear':
            s1 = need(f'layers.{i}.blocks.0.attn.s1')
            if s1.dim() != 4 or s1.shape[0] != 1 or s1.shape[2] != 1:
                raise CheckpointFormatError(f'layers.{i}.blocks.0.attn.s1 has shape {tuple(s1.shape)}, '
                                            f'expected (1, h, 1, 2d)')
            heads, head_dim = s1.shape[1], s1.shape[3] // 2
        else:
            # softmax RoPE: d/2 values; the linear one: d values (see expected_rope_angle)
            rope = sd.get(f'layers.{i}.RoPE.angle')
            rope_lin = sd.get(f'layers.{i}.RoPE_linear.angle')
            if rope is not None:
                head_dim = 2 * rope.numel()
            elif rope_lin is not None:
                head_dim = rope_lin.numel()
            else:
                raise CheckpointFormatError(
                    f'stage {i} (softmax attention): cannot infer its head count without '
                    f'layers.{i}.RoPE.angle')
            if head_dim == 0 or dims % head_dim:
                raise CheckpointFormatError(f'stage {i}: {dims} channels are not a multiple of the '
                                            f'head dim {head_dim} given by its RoPE buffer')
            heads = dims // head_dim
        if heads * head_dim != dims:
            raise CheckpointFormatError(f'stage {i}: {heads} heads x head dim {head_dim} != {dims} channels')
        embed_dims.append(int(dims))
        depths.append(len(blocks))
        num_heads.append(int(heads))
        head_dims.append(int(head_dim))
        attn_types.append(kind)
        hidden.append(int(need(f'layers.{i}.blocks.0.ffn.fc1.weight').shape[0]))

    mlp_ratio = 3.5  # the released value; otherwise the stage-1 ratio, checked on every stage
    if any(int(mlp_ratio * c) != f for c, f in zip(embed_dims, hidden)):
        mlp_ratio = hidden[0] / embed_dims[0]
        if any(int(mlp_ratio * c) != f for c, f in zip(embed_dims, hidden)):
            raise CheckpointFormatError(f'FFN widths {hidden} are not int(r * C) for one ratio r '
                                        f'(embed dims {embed_dims})')
    arch = dict(
        name='custom',
        embed_dims=embed_dims,
        depths=depths,
        num_heads=num_heads,
        head_dims=head_dims,
        cls_proj_channels=int(need('proj.weight').shape[0]),
        num_classes=int(need('head.weight').shape[0]),
        attn_types=attn_types,
        in_channels=int(need('patch_embed.proj.0.weight').shape[1]),
        mlp_ratio=float(mlp_ratio),
    )
    for name, setting in PolaFormerPP.arch_zoo.items():
        if (list(setting['embed_dims']) == embed_dims and list(setting['depths']) == depths
                and list(setting['num_heads']) == num_heads
                and setting.get('cls_proj_channels', 2048) == arch['cls_proj_channels']):
            arch['name'] = name
            break
    return arch


# ----------------------------------------------------------------------------- RoPE buffers
def expected_rope_angle(numel: int) -> Tensor:
    """The authors' RoPE buffer of ``numel`` values (``numel`` even).

    Their 2-D RoPE over ``c = 2 * numel`` channels stores one axis' frequencies,
    which are :func:`polaformerpp.ops.rope_frequencies` of ``c`` channels
    (``1 / 10000 ** linspace(0, 1, numel / 2)``, each value twice).
    ``layers.i.RoPE.angle`` (softmax, over ``d`` channels) has ``d / 2`` values,
    ``layers.i.RoPE_linear.angle`` (linear, over ``2d``) ``d`` values.

    Returns:
        Tensor: ``(numel,)`` fp32.
    """
    return rope_frequencies(2 * numel)


def _check_rope(key: str, value: Tensor, kind: str, head_dim: Optional[int]) -> List[str]:
    """Problems of one RoPE buffer (its size for the stage's head dim, its values)."""
    problems = []
    numel = value.numel()
    if head_dim is not None:
        expected_numel = head_dim // 2 if kind == 'RoPE' else head_dim
        if numel != expected_numel:
            problems.append(f'{key}: {numel} values, but the stage head dim {head_dim} implies '
                            f'{expected_numel}; the converted model recomputes {expected_numel}')
    if numel % 2 or numel == 0:
        problems.append(f'{key}: {"odd" if numel else "zero"} number of values ({numel}), '
                        f'not pairs of RoPE frequencies')
        return problems
    expected = expected_rope_angle(numel)
    got = value.detach().float().flatten().cpu()
    if not torch.allclose(got, expected, rtol=1e-5, atol=1e-7):
        err = (got - expected).abs().max().item()
        problems.append(f'{key}: differs from 1/10000**linspace(0,1,{numel // 2}) repeated twice '
                        f'(max abs diff {err:.3g}); the converted model uses the standard values')
    return problems


# ----------------------------------------------------------------------------- conversion
def _transform(key: str, value: Tensor, transform: Optional[str]) -> Tensor:
    """Reshape an authors' tensor to the project's shape (see the module docstring)."""
    if transform is None:
        return value
    shape = tuple(value.shape)
    if transform == 'temperature':  # (1, h, 1, 2d) -> (h, 2d)
        if value.dim() == 4 and shape[0] == 1 and shape[2] == 1:
            return value.reshape(shape[1], shape[3])
        if value.dim() == 2:
            return value
    elif transform == 'layer_scale':  # (1, C, 1, 1) -> (C,)
        if value.dim() == 4 and shape[0] == 1 and shape[2:] == (1, 1):
            return value.reshape(shape[1])
        if value.dim() == 1:
            return value
    elif transform == 'head':  # (K, P, 1, 1) -> (K, P)
        if value.dim() == 4 and shape[2:] == (1, 1):
            return value.reshape(shape[0], shape[1])
        if value.dim() <= 2:
            return value
    raise CheckpointFormatError(f'{key}: unexpected shape {shape} for a {transform} tensor')


def build_classifier(arch: dict) -> nn.Module:
    """The project's classifier for ``arch`` (:func:`infer_arch`), keyed like mmpretrain's
    ``ImageClassifier``: ``backbone`` (:class:`PolaFormerPP`, ``out_indices=(4,)``) and
    ``head.fc`` (``Linear(P, num_classes)``). Only its ``state_dict`` layout matters."""
    model = nn.Module()
    model.backbone = PolaFormerPP(
        arch=dict(embed_dims=arch['embed_dims'], depths=arch['depths'], num_heads=arch['num_heads'],
                  cls_proj_channels=arch['cls_proj_channels']),
        in_channels=arch['in_channels'], out_indices=(4, ), attn_types=arch['attn_types'],
        mlp_ratio=arch['mlp_ratio'], drop_path_rate=0.0)
    model.head = nn.Module()
    model.head.fc = nn.Linear(arch['cls_proj_channels'], arch['num_classes'])
    return model


def convert_official_state_dict(
        state_dict: Dict[str, Tensor],
        check_target: bool = True) -> Tuple['OrderedDict[str, Tensor]', ConversionReport]:
    """Convert an authors' state_dict to the project's classifier keys and shapes.

    Never raises on unknown/missing keys: they are listed in the report
    (``report.ok`` is False). Raises :class:`CheckpointFormatError` only when
    the architecture cannot be inferred or a tensor has an impossible shape.
    RoPE buffers that differ from the standard frequencies are warned about
    (``UserWarning``) and listed in ``report.warnings``.

    Args:
        state_dict: the authors' ``state_dict`` (a ``module.`` prefix is removed).
        check_target: compare the result with the keys and shapes of
            :func:`build_classifier` for the inferred architecture.

    Returns:
        tuple: ``(new_state_dict, report)``.
    """
    sd = strip_module_prefix(state_dict)
    report = ConversionReport()
    arch = infer_arch(sd)
    report.arch = arch
    new_sd: 'OrderedDict[str, Tensor]' = OrderedDict()
    for key, value in sd.items():
        rope = _ROPE_KEY.fullmatch(key)
        if rope:
            i = int(rope.group('i'))
            problems = _check_rope(key, value, rope.group('kind'), arch['head_dims'][i] if i < 4 else None)
            for p in problems:
                warnings.warn(p)
            report.warnings.extend(problems)
            report.dropped.append((key, 'deterministic RoPE frequencies, recomputed by the model'))
            continue
        hit = convert_key(key)
        if hit is None:
            report.unknown.append(key)
            continue
        new_key, transform = hit
        if new_key in new_sd:
            report.unknown.append(f'{key} (maps to {new_key}, already filled)')
            continue
        new_sd[new_key] = _transform(key, value, transform)
        report.mapped.append((key, new_key))
    if check_target:
        target = {k: tuple(v.shape) for k, v in build_classifier(arch).state_dict().items()}
        sources = {k: official_key(k, arch['attn_types']) for k in target if k not in new_sd}
        report.missing = [k if src is None else f'{k} (from {src})' for k, src in sources.items()]
        report.unexpected = [k for k in new_sd if k not in target]
        report.shape_mismatch = [
            f'{k}: converted {tuple(new_sd[k].shape)}, model expects {target[k]}'
            for k in new_sd if k in target and tuple(new_sd[k].shape) != target[k]]
    return new_sd, report
