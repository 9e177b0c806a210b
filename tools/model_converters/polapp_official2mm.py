#!/usr/bin/env python
"""Convert the authors' PolaFormer++ classification checkpoints to this project's layout.

Usage::

    python tools/model_converters/polapp_official2mm.py SRC DST [--ema] [--allow-partial]

``SRC`` is a checkpoint released by the authors: a dict with ``'model'`` (and
``'state_dict_ema'``); ``--ema`` converts the EMA weights instead. A bare
state_dict, or one stored under ``'state_dict'``, is accepted too.

``DST`` receives ``{'state_dict': ..., 'meta': {...}}`` (``torch.save``) for the
mmpretrain ``ImageClassifier`` of ``configs/_base_/models/polapp_classifier.py``:
``backbone=PolaFormerPP(arch=..., out_indices=(4,))`` + ``GlobalAveragePooling``
+ ``LinearClsHead`` (``head.fc``). Load it with ``load_from=DST`` / ``--checkpoint``
or ``init_cfg=dict(type='Pretrained', checkpoint=DST, prefix='backbone.')`` for a
dense-prediction backbone.

The architecture (b0...b5 or a custom one) is inferred from the tensor shapes,
printed, and stored in ``meta``. Every source key is either mapped or dropped
on purpose (the deterministic RoPE frequency buffers, checked against the
expected values first). Source keys without a rule, target keys left unfilled
and shape mismatches are printed and make the script exit with status 1 unless
``--allow-partial`` is given.

Key mapping (authors' -> project)::

    patch_embed.proj.{0,1,3,4,6,7,9,10}    backbone.stem.{0.conv,0.bn,2.conv,2.bn,4.conv,4.bn,6.conv,6.bn}
    layers.i.blocks.j.pos                  backbone.stages.i.blocks.j.cpe
    layers.i.blocks.j.norm{1,2}.norm       backbone.stages.i.blocks.j.norm{1,2}
    layers.i.blocks.j.attn.{qkvg,qkvo,lepe,proj}   (same names)
    layers.i.blocks.j.attn.s1 / s2 (1,h,1,2d)      attn.temp_same / temp_opp (h,2d)  (logits in both)
    layers.i.blocks.j.gamma_{1,2} (1,C,1,1)        gamma{1,2} (C,)
    layers.i.blocks.j.ffn.{fc1,dwconv,fc2}         (same names)
    layers.i.downsample.{reduction,norm}   backbone.stages.i.downsample.{conv,bn}
    layers.i.RoPE.angle, RoPE_linear.angle dropped (recomputed by the model)
    proj / norm                            backbone.cls_proj.conv / backbone.cls_proj.bn
    head (K,P,1,1)                         head.fc (K,P)

The conversion itself lives in importable functions
(:func:`load_official_checkpoint`, :func:`infer_arch`,
:func:`convert_official_state_dict`, :func:`convert_file`).
"""
import argparse
import os
import os.path as osp
import re
import sys
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

__all__ = [
    'ConversionReport', 'CheckpointFormatError', 'load_official_checkpoint', 'select_state_dict',
    'infer_arch', 'convert_key', 'official_key',
    'expected_rope_angle', 'convert_official_state_dict', 'build_target_shapes', 'convert_file',
    'main'
]

_LEAF = r'(?P<leaf>weight|bias|running_mean|running_var|num_batches_tracked)'
_BLOCK = r'layers\.(?P<i>\d+)\.blocks\.(?P<j>\d+)\.'
_STEM = {0: '0.conv', 1: '0.bn', 3: '2.conv', 4: '2.bn', 6: '4.conv', 7: '4.bn', 9: '6.conv', 10: '6.bn'}

# (source regex, target template, transform); matched with re.fullmatch, first hit wins.
_RULES: List[Tuple[str, str, Optional[str]]] = [
    *[(rf'patch_embed\.proj\.{src}\.{_LEAF}', f'backbone.stem.{dst}.{{leaf}}', None)
      for src, dst in _STEM.items()],
    (_BLOCK + r'pos\.' + _LEAF, 'backbone.stages.{i}.blocks.{j}.cpe.{leaf}', None),
    (_BLOCK + r'norm(?P<n>[12])\.norm\.' + _LEAF, 'backbone.stages.{i}.blocks.{j}.norm{n}.{leaf}', None),
    (_BLOCK + r'attn\.(?P<m>qkvg|qkvo|lepe|proj)\.' + _LEAF,
     'backbone.stages.{i}.blocks.{j}.attn.{m}.{leaf}', None),
    (_BLOCK + r'attn\.s1', 'backbone.stages.{i}.blocks.{j}.attn.temp_same', 'temperature'),
    (_BLOCK + r'attn\.s2', 'backbone.stages.{i}.blocks.{j}.attn.temp_opp', 'temperature'),
    (_BLOCK + r'gamma_(?P<n>[12])', 'backbone.stages.{i}.blocks.{j}.gamma{n}', 'layer_scale'),
    (_BLOCK + r'ffn\.(?P<m>fc1|dwconv|fc2)\.' + _LEAF, 'backbone.stages.{i}.blocks.{j}.ffn.{m}.{leaf}', None),
    (r'layers\.(?P<i>\d+)\.downsample\.reduction\.' + _LEAF, 'backbone.stages.{i}.downsample.conv.{leaf}', None),
    (r'layers\.(?P<i>\d+)\.downsample\.norm\.' + _LEAF, 'backbone.stages.{i}.downsample.bn.{leaf}', None),
    (r'proj\.' + _LEAF, 'backbone.cls_proj.conv.{leaf}', None),
    (r'norm\.' + _LEAF, 'backbone.cls_proj.bn.{leaf}', None),
    (r'head\.(?P<leaf>weight|bias)', 'head.fc.{leaf}', 'head'),
]
_ROPE_KEY = re.compile(r'layers\.(?P<i>\d+)\.(?P<kind>RoPE|RoPE_linear)\.angle')
_SOURCE_CONTAINERS = ('model', 'state_dict')
_EMA_CONTAINERS = ('state_dict_ema', 'model_ema')


class CheckpointFormatError(ValueError):
    """The file or object is not a PolaFormer++ checkpoint of the authors' layout."""


@dataclass
class ConversionReport:
    """What :func:`convert_official_state_dict` did with every key."""
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
        lines = []
        for title, items in (('unknown source keys (no mapping rule)', self.unknown),
                             ('target keys left unfilled', self.missing),
                             ('converted keys the target model does not have', self.unexpected),
                             ('shape mismatches', self.shape_mismatch)):
            if items:
                lines.append(f'{title} ({len(items)}):')
                lines.extend(f'  {item}' for item in items)
        return lines


# ----------------------------------------------------------------------------- loading

def _torch_load(path: str, trust: bool):
    if trust:
        return torch.load(path, map_location='cpu', weights_only=False)
    # the authors' files may hold their argparse namespace next to the weights
    with torch.serialization.safe_globals([argparse.Namespace]):
        return torch.load(path, map_location='cpu', weights_only=True)


def _is_state_dict(obj) -> bool:
    return isinstance(obj, dict) and len(obj) > 0 and all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())


def select_state_dict(ckpt, ema: bool = False) -> Tuple[Dict[str, torch.Tensor], str]:
    """Pick the weights out of a loaded checkpoint object.

    Returns:
        tuple: the state_dict and the name of the entry it came from
        (``'model'``, ``'state_dict'``, ``'state_dict_ema'`` or ``'<bare>'``).
    """
    if not isinstance(ckpt, dict):
        raise CheckpointFormatError(
            f'expected a checkpoint dict (with "model"/"state_dict_ema" or a bare state_dict), '
            f'got a {type(ckpt).__name__}')
    names = list(ckpt)
    if ema:
        for name in _EMA_CONTAINERS:
            if name in ckpt:
                if not _is_state_dict(ckpt[name]):
                    raise CheckpointFormatError(f'checkpoint entry {name!r} is not a state_dict')
                return dict(ckpt[name]), name
        raise CheckpointFormatError(
            f'--ema: the checkpoint has no EMA weights ({" / ".join(_EMA_CONTAINERS)}); '
            f'its top-level keys are {names[:20]}')
    for name in _SOURCE_CONTAINERS:
        if name in ckpt:
            if not _is_state_dict(ckpt[name]):
                raise CheckpointFormatError(f'checkpoint entry {name!r} is not a state_dict')
            return dict(ckpt[name]), name
    if _is_state_dict(ckpt):
        return dict(ckpt), '<bare>'
    raise CheckpointFormatError(
        f'no weights found: expected a "model" or "state_dict" entry, or a bare state_dict '
        f'(str -> Tensor); the top-level keys are {names[:20]}')


def load_official_checkpoint(path: str, ema: bool = False,
                             trust: bool = False) -> Tuple[Dict[str, torch.Tensor], str]:
    """Load ``path`` and return ``(state_dict, entry name)``; see :func:`select_state_dict`.

    Raises:
        FileNotFoundError: no such file.
        CheckpointFormatError: not a torch checkpoint, or no weights in it.
    """
    if not osp.isfile(path):
        raise FileNotFoundError(f'checkpoint not found: {path}')
    with open(path, 'rb') as f:
        magic = f.read(4)
    if magic != b'PK\x03\x04' and not magic.startswith(b'\x80'):
        raise CheckpointFormatError(f'{path} is not a loadable torch checkpoint: it is neither a '
                                    f'torch.save zip archive nor a pickle (starts with {magic!r})')
    try:
        ckpt = _torch_load(path, trust)
    except Exception as e:  # noqa: BLE001 - pickle/zip errors of every kind
        hint = ('' if trust else ' If it is a trusted checkpoint that stores other Python objects, '
                'rerun with --trust-checkpoint (full unpickling).')
        first = str(e).strip().splitlines()[0] if str(e).strip() else ''
        raise CheckpointFormatError(f'{path} is not a loadable torch checkpoint '
                                    f'({type(e).__name__}: {first[:300]}).{hint}') from e
    return select_state_dict(ckpt, ema=ema)


def _strip_prefix(sd: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Remove a ``module.`` prefix shared by every key (DataParallel/DDP)."""
    if sd and all(k.startswith('module.') for k in sd):
        return {k[len('module.'):]: v for k, v in sd.items()}
    return sd


# ----------------------------------------------------------------------------- architecture

def _backbone_class():
    """The project's ``PolaFormerPP`` (the repository root is put on ``sys.path`` if needed)."""
    try:
        from polaformerpp.models import PolaFormerPP
    except ImportError:
        if REPO_ROOT in sys.path:
            raise
        sys.path.insert(0, REPO_ROOT)
        from polaformerpp.models import PolaFormerPP
    return PolaFormerPP


def _arch_zoo() -> Dict[str, dict]:
    return _backbone_class().arch_zoo


def infer_arch(sd: Dict[str, torch.Tensor]) -> dict:
    """Infer the architecture from the shapes of an authors' state_dict.

    Returns:
        dict: ``name`` (``'b0'``...``'b5'`` or ``'custom'``), ``embed_dims``,
        ``depths``, ``num_heads``, ``head_dims``, ``cls_proj_channels``,
        ``num_classes``, ``attn_types``, ``in_channels``, ``mlp_ratio``.

    Raises:
        CheckpointFormatError: the keys do not describe a PolaFormer++ classifier.
    """
    sd = _strip_prefix(sd)

    def need(key):
        if key not in sd:
            raise CheckpointFormatError(f'cannot infer the architecture: missing key {key!r}')
        return sd[key]

    stage_ids = sorted({int(m.group(1)) for k in sd for m in [re.match(r'layers\.(\d+)\.', k)] if m})
    if stage_ids != [0, 1, 2, 3]:
        raise CheckpointFormatError(
            f'expected 4 stages layers.0..layers.3 in the checkpoint, found {stage_ids or "none"} '
            f'(is this a PolaFormer++ classification checkpoint?)')
    embed_dims, depths, num_heads, head_dims, attn_types, hidden = [], [], [], [], [], []
    for i in stage_ids:
        blocks = sorted({int(m.group(1)) for k in sd
                         for m in [re.match(rf'layers\.{i}\.blocks\.(\d+)\.', k)] if m})
        if not blocks or blocks != list(range(len(blocks))):
            raise CheckpointFormatError(f'stage {i}: block indices {blocks} are not 0..n-1')
        dims = need(f'layers.{i}.blocks.0.norm1.norm.weight').shape[0]
        kinds = set()
        for j in blocks:
            has_g = f'layers.{i}.blocks.{j}.attn.qkvg.weight' in sd
            has_o = f'layers.{i}.blocks.{j}.attn.qkvo.weight' in sd
            if has_g == has_o:
                raise CheckpointFormatError(
                    f'block layers.{i}.blocks.{j}: expected exactly one of attn.qkvg (linear) '
                    f'and attn.qkvo (softmax)')
            kinds.add('linear' if has_g else 'softmax')
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
    proj_w = need('proj.weight')
    head_w = need('head.weight')
    arch = dict(
        name='custom',
        embed_dims=embed_dims,
        depths=depths,
        num_heads=num_heads,
        head_dims=head_dims,
        cls_proj_channels=int(proj_w.shape[0]),
        num_classes=int(head_w.shape[0]),
        attn_types=attn_types,
        in_channels=int(need('patch_embed.proj.0.weight').shape[1]),
        mlp_ratio=float(mlp_ratio),
    )
    for name, setting in _arch_zoo().items():
        if (list(setting['embed_dims']) == embed_dims and list(setting['depths']) == depths
                and list(setting['num_heads']) == num_heads
                and setting.get('cls_proj_channels', 2048) == arch['cls_proj_channels']):
            arch['name'] = name
            break
    return arch


def expected_rope_angle(numel: int) -> torch.Tensor:
    """The authors' RoPE buffer of ``numel`` values: ``1/10000**linspace(0, 1, numel/2)``, each twice."""
    freqs = 1.0 / (10000 ** torch.linspace(0, 1, numel // 2, dtype=torch.float32))
    return freqs.repeat_interleave(2)


def _check_rope(key: str, value: torch.Tensor, kind: str, head_dim: Optional[int]) -> List[str]:
    problems = []
    numel = value.numel()
    expected_numel = None
    if head_dim is not None:
        # softmax RoPE rotates d channels (d/2 angles); the linear one rotates 2d (d angles)
        expected_numel = head_dim // 2 if kind == 'RoPE' else head_dim
        if numel != expected_numel:
            problems.append(f'{key}: {numel} values, but the stage head dim {head_dim} implies '
                            f'{expected_numel}; the converted model recomputes {expected_numel}')
    if numel % 2:
        problems.append(f'{key}: odd number of values ({numel}), not pairs of RoPE frequencies')
        return problems
    expected = expected_rope_angle(numel)
    got = value.detach().float().flatten().cpu()
    if not torch.allclose(got, expected, rtol=1e-5, atol=1e-7):
        err = (got - expected).abs().max().item()
        problems.append(f'{key}: differs from 1/10000**linspace(0,1,{numel // 2}) repeated twice '
                        f'(max abs diff {err:.3g}); the converted model uses the standard values')
    return problems


# ----------------------------------------------------------------------------- conversion

def convert_key(key: str) -> Optional[Tuple[str, Optional[str]]]:
    """Map one authors' key to ``(project key, transform)``; ``None`` when no rule matches."""
    for pattern, template, transform in _COMPILED_RULES:
        m = pattern.fullmatch(key)
        if m:
            return template.format(**m.groupdict()), transform
    return None


_COMPILED_RULES = [(re.compile(p), t, f) for p, t, f in _RULES]
# the inverse rules (project key -> authors' key), to name the source of a missing target key
_INVERSE_RULES = [(re.compile(re.sub(r'\\\{(\w+)\\\}', r'(?P<\1>[^.]+)', re.escape(t))),
                   re.sub(r'\(\?P<(\w+)>[^)]*\)', r'{\1}', p).replace('\\.', '.'))
                  for p, t, _ in _RULES]


def official_key(project_key: str) -> Optional[str]:
    """The authors' key that :func:`convert_key` maps to ``project_key`` (``None`` if none)."""
    for pattern, template in _INVERSE_RULES:
        m = pattern.fullmatch(project_key)
        if m:
            key = template.format(**m.groupdict())
            hit = convert_key(key)
            if hit is not None and hit[0] == project_key:
                return key
    return None


def _transform(key: str, value: torch.Tensor, transform: Optional[str]) -> torch.Tensor:
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


def build_target_shapes(arch: dict) -> Dict[str, Tuple[int, ...]]:
    """Key -> shape of the project's ``ImageClassifier`` for ``arch`` (see :func:`infer_arch`)."""
    backbone = _backbone_class()(
        arch=dict(embed_dims=arch['embed_dims'], depths=arch['depths'], num_heads=arch['num_heads'],
                  cls_proj_channels=arch['cls_proj_channels']),
        in_channels=arch['in_channels'], out_indices=(4, ), attn_types=arch['attn_types'],
        mlp_ratio=arch['mlp_ratio'], drop_path_rate=0.0)
    shapes = OrderedDict((f'backbone.{k}', tuple(v.shape)) for k, v in backbone.state_dict().items())
    shapes['head.fc.weight'] = (arch['num_classes'], arch['cls_proj_channels'])
    shapes['head.fc.bias'] = (arch['num_classes'], )
    return shapes


def convert_official_state_dict(
        sd: Dict[str, torch.Tensor],
        check_target: bool = True) -> Tuple['OrderedDict[str, torch.Tensor]', ConversionReport]:
    """Convert an authors' state_dict to the project's classifier keys.

    Never raises on unknown/missing keys: they are listed in the report
    (``report.ok`` is False). Raises :class:`CheckpointFormatError` only when
    the architecture cannot be inferred or a tensor has an impossible shape.

    Args:
        sd: the authors' ``state_dict`` (a ``module.`` prefix is removed).
        check_target: compare the result with the keys and shapes of the
            project's model built for the inferred architecture.

    Returns:
        tuple: ``(new_state_dict, report)``.
    """
    sd = _strip_prefix(sd)
    report = ConversionReport()
    arch = infer_arch(sd)
    report.arch = arch
    new_sd: 'OrderedDict[str, torch.Tensor]' = OrderedDict()
    for key, value in sd.items():
        rope = _ROPE_KEY.fullmatch(key)
        if rope:
            i = int(rope.group('i'))
            kind = rope.group('kind')
            problems = _check_rope(key, value, kind, arch['head_dims'][i] if i < 4 else None)
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
        target = build_target_shapes(arch)
        report.missing = [k if official_key(k) is None else f'{k} (from {official_key(k)})'
                          for k in target if k not in new_sd]
        report.unexpected = [k for k in new_sd if k not in target]
        report.shape_mismatch = [
            f'{k}: converted {tuple(new_sd[k].shape)}, model expects {target[k]}'
            for k in new_sd if k in target and tuple(new_sd[k].shape) != target[k]]
    return new_sd, report


def _describe(arch: dict) -> str:
    text = (f'arch {arch["name"]}: embed_dims={arch["embed_dims"]} depths={arch["depths"]} '
            f'num_heads={arch["num_heads"]} cls_proj_channels={arch["cls_proj_channels"]} '
            f'num_classes={arch["num_classes"]} attn_types={arch["attn_types"]}')
    if arch['in_channels'] != 3:
        text += f' in_channels={arch["in_channels"]}'
    if arch['mlp_ratio'] != 3.5:
        text += f' mlp_ratio={arch["mlp_ratio"]}'
    return text


def convert_file(src: str, dst: str, ema: bool = False, allow_partial: bool = False,
                 trust: bool = False, log=print) -> ConversionReport:
    """Convert ``src`` to ``dst`` and return the report.

    Raises:
        CheckpointFormatError: unreadable input, or (without ``allow_partial``)
        unknown/missing keys or shape mismatches, named in the message; nothing
        is written then.
    """
    sd, entry = load_official_checkpoint(src, ema=ema, trust=trust)
    with warnings.catch_warnings():  # the RoPE warnings are logged below
        warnings.simplefilter('ignore')
        new_sd, report = convert_official_state_dict(sd)
    arch = report.arch
    log(f'source: {src} [{entry}], {len(sd)} tensors')
    log(_describe(arch))
    if arch['attn_types'] != ['linear', 'linear', 'softmax', 'softmax']:
        log(f'note: set backbone.attn_types={tuple(arch["attn_types"])} in the config')
    for w in report.warnings:
        log(f'warning: {w}')
    problems = report.problems()
    if problems:
        for line in problems:
            log(line)
        if not allow_partial:
            raise CheckpointFormatError(
                'conversion incomplete, nothing written (pass --allow-partial to write it anyway): '
                + '; '.join(report.unknown + report.missing + report.unexpected + report.shape_mismatch))
        log('--allow-partial: writing the incomplete conversion')
    meta = dict(
        arch=arch['name'],
        arch_settings={k: arch[k] for k in ('embed_dims', 'depths', 'num_heads', 'cls_proj_channels')},
        attn_types=list(arch['attn_types']),
        num_classes=arch['num_classes'],
        in_channels=arch['in_channels'],
        mlp_ratio=arch['mlp_ratio'],
        source=osp.basename(src),
        source_weights=entry,
        converter='tools/model_converters/polapp_official2mm.py',
        complete=report.ok,
    )
    out_dir = osp.dirname(osp.abspath(dst))
    os.makedirs(out_dir, exist_ok=True)
    torch.save({'state_dict': new_sd, 'meta': meta}, dst)
    log(f'converted {len(report.mapped)} tensors, dropped {len(report.dropped)} RoPE buffers -> {dst}')
    return report


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Convert an authors' PolaFormer++ classification checkpoint to this "
        "project's mmpretrain layout.")
    parser.add_argument('src', help="the authors' checkpoint ({'model', 'state_dict_ema'} or a state_dict)")
    parser.add_argument('dst', help='output file')
    parser.add_argument('--ema', action='store_true', help="convert 'state_dict_ema' instead of 'model'")
    parser.add_argument('--allow-partial', action='store_true',
                        help='write the result even when keys are unknown, missing or mis-shaped')
    parser.add_argument('--trust-checkpoint', action='store_true',
                        help='load with full unpickling (only for trusted files that store '
                        'Python objects besides tensors)')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        convert_file(args.src, args.dst, ema=args.ema, allow_partial=args.allow_partial,
                     trust=args.trust_checkpoint)
    except (CheckpointFormatError, FileNotFoundError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
