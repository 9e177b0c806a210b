#!/usr/bin/env python
"""Write the raw or the EMA weights of a training checkpoint as a plain weights file.

Usage::

    python tools/model_converters/extract_weights.py work_dirs/polapp-b2/epoch_300.pth polapp-b2_raw.pth --weights raw
    python tools/model_converters/extract_weights.py work_dirs/polapp-b2/epoch_300.pth polapp-b2_ema.pth --weights ema

A checkpoint saved by ``tools/train.py`` with mmengine's ``EMAHook`` holds both
weight sets, swapped by the hook: ``state_dict`` has the EMA weights (what
``tools/test.py`` evaluates) and ``ema_state_dict`` the raw ones under a
``module.`` prefix, beside the averaging counter ``steps``. ``init_cfg=dict(
type='Pretrained', checkpoint=...)`` always reads ``state_dict``, so a
downstream recipe that starts from the raw ImageNet weights (as the authors'
detection and segmentation code does) needs them written out first. ``DST``
receives ``{'state_dict': ..., 'meta': {...}}``; optimizer, scheduler and
message-hub states are left out. A checkpoint without ``ema_state_dict`` has
only one weight set: ``--weights raw`` writes its ``state_dict``, ``--weights
ema`` is refused. The file is loaded with ``weights_only=True`` unless
``--unsafe-load`` is given.
"""
import argparse
import os
import os.path as osp
import sys
from collections import OrderedDict

import torch

from polaformerpp.utils.checkpoint import UNSAFE_LOAD_HELP, exit_on_checkpoint_error, load_checkpoint_file

EMA_PREFIX = 'module.'
EMA_COUNTER = 'steps'


def select_weights(checkpoint, weights: str) -> OrderedDict:
    """The ``weights`` (``'raw'`` or ``'ema'``) state dict of a Runner checkpoint (module docstring).

    Raises:
        ValueError: not a Runner checkpoint (no ``state_dict``), or ``'ema'`` asked of one without EMA.
    """
    if weights not in ('raw', 'ema'):
        raise ValueError(f"--weights: expected 'raw' or 'ema', got {weights!r}")
    if not isinstance(checkpoint, dict) or 'state_dict' not in checkpoint:
        keys = sorted(checkpoint) if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise ValueError(f'expected a training checkpoint with a state_dict entry, got {keys}')
    ema = checkpoint.get('ema_state_dict')
    if ema is None:
        if weights == 'ema':
            raise ValueError('--weights ema: the checkpoint has no ema_state_dict (trained without EMAHook)')
        return OrderedDict(checkpoint['state_dict'])
    if weights == 'ema':
        return OrderedDict(checkpoint['state_dict'])
    raw = OrderedDict()
    for key, value in ema.items():
        if key == EMA_COUNTER:
            continue
        if not key.startswith(EMA_PREFIX):
            raise ValueError(f'ema_state_dict: expected keys under {EMA_PREFIX!r}, got {key!r}')
        raw[key[len(EMA_PREFIX):]] = value
    missing = sorted(set(checkpoint['state_dict']) ^ set(raw))
    if missing:
        raise ValueError(f'state_dict and ema_state_dict hold different tensors: {missing[:5]}')
    return raw


def extract(src: str, dst: str, weights: str, unsafe: bool = False) -> OrderedDict:
    """Write ``{'state_dict': <weights of src>, 'meta': ...}`` to ``dst``; returns the state dict."""
    checkpoint = load_checkpoint_file(src, unsafe=unsafe)
    state_dict = select_weights(checkpoint, weights)
    meta = dict(checkpoint.get('meta') or {})
    for key in ('hook_msgs', 'resume_state'):
        meta.pop(key, None)
    meta.update(weights=weights, source=osp.basename(src))
    os.makedirs(osp.dirname(osp.abspath(dst)), exist_ok=True)
    torch.save({'state_dict': state_dict, 'meta': meta}, dst)
    return state_dict


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Write the raw or the EMA weights of a training checkpoint.')
    parser.add_argument('src', help='a checkpoint saved by tools/train.py (epoch_N.pth / iter_N.pth)')
    parser.add_argument('dst', help='output file')
    parser.add_argument('--weights', choices=('raw', 'ema'), required=True,
                        help="'raw': the trained weights; 'ema': their moving average (what tools/test.py evaluates)")
    parser.add_argument('--unsafe-load', action='store_true', help=UNSAFE_LOAD_HELP)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        state_dict = extract(args.src, args.dst, args.weights, unsafe=args.unsafe_load)
    except (ValueError, FileNotFoundError) as error:
        print(f'extract_weights.py: error: {error}', file=sys.stderr)
        return 1
    print(f'{len(state_dict)} tensors ({args.weights} weights) -> {args.dst}')
    return 0


if __name__ == '__main__':
    sys.exit(exit_on_checkpoint_error(main))
