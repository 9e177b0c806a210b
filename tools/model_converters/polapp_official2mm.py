#!/usr/bin/env python
"""Convert the authors' PolaFormer++ classification checkpoints to this project's layout.

Usage::

    python tools/model_converters/polapp_official2mm.py SRC DST [--ema] [--allow-partial]

``SRC`` is a checkpoint released by the authors: a dict with ``'model'`` (and
``'state_dict_ema'``); ``--ema`` converts the EMA weights instead. A bare
state_dict, or one stored under ``'state_dict'``, is accepted too. It is loaded
with ``weights_only=True`` unless ``--trust-checkpoint`` is given.

``DST`` receives ``{'state_dict': ..., 'meta': {...}}`` (``torch.save``) for the
mmpretrain ``ImageClassifier`` of ``configs/_base_/models/polapp_classifier.py``:
``backbone=PolaFormerPP(arch=..., out_indices=(4,))`` + ``GlobalAveragePooling``
+ ``LinearClsHead`` (``head.fc``). Load it with ``load_from=DST`` / ``--checkpoint``
or ``init_cfg=dict(type='Pretrained', checkpoint=DST, prefix='backbone.')`` for a
dense-prediction backbone.

The architecture (b0...b5 or a custom one) is inferred from the tensor shapes,
printed, and stored in ``meta``. The key mapping is
:func:`polaformerpp.models.backbones.polaformerpp_convert.convert_official_state_dict`
(documented there). Source keys without a rule, target keys left unfilled and
shape mismatches are printed and make the script exit with status 1 unless
``--allow-partial`` is given; a complete conversion is loaded into the
project's classifier with ``strict=True`` before it is written.
"""
import argparse
import os
import os.path as osp
import sys
import warnings
from typing import Dict, Tuple

import torch

from polaformerpp.models.backbones.polaformerpp import RELEASED_ATTN_TYPES
from polaformerpp.models.backbones.polaformerpp_convert import (
    CheckpointFormatError,
    ConversionReport,
    build_classifier,
    convert_key,
    convert_official_state_dict,
    expected_rope_angle,
    infer_arch,
    official_key,
)

# the mapping API is re-exported for scripts that load this tool as a module
__all__ = [
    'ConversionReport', 'CheckpointFormatError', 'load_official_checkpoint', 'select_state_dict',
    'infer_arch', 'convert_key', 'official_key', 'expected_rope_angle', 'convert_official_state_dict',
    'convert_file', 'main'
]

SOURCE_CONTAINERS = ('model', 'state_dict')
EMA_CONTAINERS = ('state_dict_ema', 'model_ema')


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
        for name in EMA_CONTAINERS:
            if name in ckpt:
                if not _is_state_dict(ckpt[name]):
                    raise CheckpointFormatError(f'checkpoint entry {name!r} is not a state_dict')
                return dict(ckpt[name]), name
        raise CheckpointFormatError(
            f'--ema: the checkpoint has no EMA weights ({" / ".join(EMA_CONTAINERS)}); '
            f'its top-level keys are {names[:20]}')
    for name in SOURCE_CONTAINERS:
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


# ----------------------------------------------------------------------------- conversion
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
    if tuple(arch['attn_types']) != RELEASED_ATTN_TYPES:
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
    else:
        build_classifier(arch).load_state_dict(new_sd, strict=True)
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
    os.makedirs(osp.dirname(osp.abspath(dst)), exist_ok=True)
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
