"""FID (and IS of the first set) between two sets: ``.npz`` files of images, features or statistics,
or folders of images.

Each file may hold ``arr_0`` (uint8 images ``(N, H, W, 3)``, e.g. from
``tools/generation/sample.py`` or an ADM reference batch), ``pool`` (features
``(N, D)``, optionally ``logits``), or ``mu`` + ``sigma`` (statistics; used in
preference to ``arr_0`` unless ``--recompute``). Images are embedded with
Inception-v3 pool3 from a local file (``--inception``). Statistics from a
different network (e.g. ADM's TensorFlow reference ``mu``/``sigma``) are not
comparable with features from yours: use ``--recompute`` with your network then.
A folder's image files (PNG, JPEG, BMP, WebP; searched recursively) must all
have one size. Embedding shows a progress bar on stderr when it is a terminal
(``--no-progress`` or ``POLAPP_NO_PROGRESS=1``: none); the result goes to stdout.

Examples::

    python tools/generation/fid.py samples.npz VIRTUAL_imagenet256_labeled.npz \\
        --inception data/inception/inception_v3_fid.pth --recompute
    python tools/generation/fid.py a_features.npz b_features.npz          # 'pool' features
    python tools/generation/fid.py a.npz b.npz --extractor random-conv    # smoke test only
    python tools/generation/fid.py samples/ real_images/ --inception data/inception/inception_v3_fid.pth
"""
import argparse
import json
import os.path as osp

import numpy as np
import torch

from polaformerpp.generation import (
    InceptionV3Features,
    RandomConvFeatures,
    frechet_distance,
    inception_score,
    load_reference,
)
from polaformerpp.utils.cli import ArgumentCheckError, MissingPathError, existing_file, positive_int, run_cli
from polaformerpp.utils.progress import add_progress_argument, progress_from_args


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='FID between two sets (.npz files or image folders)')
    parser.add_argument('first', help='.npz with arr_0 images, pool features or mu/sigma, or a folder of '
                        'images (IS computed for it when logits are available)')
    parser.add_argument('second', help='reference: .npz with arr_0 images, pool features or mu/sigma, '
                        'or a folder of images')
    parser.add_argument('--inception', default=None,
                        help='Inception-v3 weights (TorchScript or torchvision state dict)')
    parser.add_argument('--extractor', choices=['inception', 'random-conv'], default='inception',
                        help="'random-conv': a fixed random conv net for smoke tests (not real FID)")
    parser.add_argument('--recompute', action='store_true',
                        help='embed arr_0 images even when the file also holds mu/sigma')
    parser.add_argument('--batch-size', type=positive_int, default=64, help='images per forward')
    parser.add_argument('--device', default=None, help="default 'cuda' if available, else 'cpu'")
    parser.add_argument('--is-splits', type=positive_int, default=10)
    parser.add_argument('--out-json', default=None, help='write {"FID": ..., "IS": ...} here')
    add_progress_argument(parser)
    return parser.parse_args(argv)


def _needs_images(path: str, recompute: bool) -> bool:
    if osp.isdir(path):
        return True
    with np.load(path) as data:
        keys = set(data.files)
    return 'pool' not in keys and 'arr_0' in keys and (recompute or not {'mu', 'sigma'} <= keys)


class _LazyExtractor:
    """Builds the feature extractor only if some file holds images."""

    def __init__(self, args):
        self.args = args
        self.module = None

    def __call__(self, images):
        if self.module is None:
            if self.args.extractor == 'random-conv':
                self.module = RandomConvFeatures()
            else:
                self.module = InceptionV3Features(self.args.inception)
            device = self.args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
            self.module.to(device)
            self.device = device
        return self.module(images.to(self.device))


def compute(args) -> dict:
    """``dict(FID=...[, IS=..., IS_std=...])`` of the parsed arguments.

    Raises:
        MissingPathError: ``first``/``second``/``--inception`` do not exist (exit code 2 on the command line).
    """
    for option, path in (('first', args.first), ('second', args.second)):
        if not (osp.isfile(path) or osp.isdir(path)):
            raise MissingPathError(f'{option}: file or folder not found: {path}')
    if args.extractor == 'inception' and any(_needs_images(p, args.recompute)
                                             for p in (args.first, args.second)):
        if not args.inception:
            raise ArgumentCheckError('these files hold images: pass --inception PATH (Inception-v3 weights) '
                             "or --extractor random-conv for a smoke test")
        existing_file(args.inception, '--inception')
    extractor = _LazyExtractor(args)
    progress = progress_from_args(args)
    first = load_reference(args.first, extractor, args.batch_size, prefer_stats=not args.recompute,
                           progress=progress)
    second = load_reference(args.second, extractor, args.batch_size, prefer_stats=not args.recompute,
                            progress=progress)
    if first['mu'].shape != second['mu'].shape:
        raise ValueError(f'feature dimensions differ: {first["mu"].shape[0]} vs {second["mu"].shape[0]}')
    result = dict(FID=frechet_distance(first['mu'], first['sigma'], second['mu'], second['sigma']))
    if 'logits' in first:
        result['IS'], result['IS_std'] = inception_score(first['logits'], args.is_splits)
    return result


def main(argv=None):
    args = parse_args(argv)
    result = compute(args)
    print(' '.join(f'{k}: {v:.4f}' for k, v in result.items()), flush=True)
    if args.out_json:
        with open(args.out_json, 'w') as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == '__main__':
    run_cli(main)
