"""FID (and IS of the first set) between two ``.npz`` files of images, features or statistics.

Each file may hold ``arr_0`` (uint8 images ``(N, H, W, 3)``, e.g. from
``tools/generation/sample.py`` or an ADM reference batch), ``pool`` (features
``(N, D)``, optionally ``logits``), or ``mu`` + ``sigma`` (statistics; used in
preference to ``arr_0`` unless ``--recompute``). Images are embedded with
Inception-v3 pool3 from a local file (``--inception``). Statistics from a
different network (e.g. ADM's TensorFlow reference ``mu``/``sigma``) are not
comparable with features from yours: use ``--recompute`` with your network then.

Examples::

    python tools/generation/fid.py samples.npz VIRTUAL_imagenet256_labeled.npz \\
        --inception data/inception/inception_v3_fid.pth --recompute
    python tools/generation/fid.py a_features.npz b_features.npz          # 'pool' features
    python tools/generation/fid.py a.npz b.npz --extractor random-conv    # smoke test only
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


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='FID between two .npz sets')
    parser.add_argument('first', help='.npz with arr_0 images, pool features or mu/sigma (IS computed '
                        'for it when logits are available)')
    parser.add_argument('second', help='.npz reference: arr_0 images, pool features or mu/sigma')
    parser.add_argument('--inception', default=None,
                        help='Inception-v3 weights (TorchScript or torchvision state dict)')
    parser.add_argument('--extractor', choices=['inception', 'random-conv'], default='inception',
                        help="'random-conv': a fixed random conv net for smoke tests (not real FID)")
    parser.add_argument('--recompute', action='store_true',
                        help='embed arr_0 images even when the file also holds mu/sigma')
    parser.add_argument('--batch-size', type=int, default=64)
    parser.add_argument('--device', default=None, help="default 'cuda' if available, else 'cpu'")
    parser.add_argument('--is-splits', type=int, default=10)
    parser.add_argument('--out-json', default=None, help='write {"FID": ..., "IS": ...} here')
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        parser.error(f'--batch-size must be >= 1, got {args.batch_size}')
    return args


def _needs_images(path: str, recompute: bool) -> bool:
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
    for path in (args.first, args.second):
        if not osp.isfile(path):
            raise FileNotFoundError(f'file not found: {path}')
    if args.extractor == 'inception' and any(_needs_images(p, args.recompute)
                                             for p in (args.first, args.second)):
        if not args.inception:
            raise ValueError('these files hold images: pass --inception PATH (Inception-v3 weights) '
                             "or --extractor random-conv for a smoke test")
    extractor = _LazyExtractor(args)
    first = load_reference(args.first, extractor, args.batch_size, prefer_stats=not args.recompute)
    second = load_reference(args.second, extractor, args.batch_size, prefer_stats=not args.recompute)
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
    main()
