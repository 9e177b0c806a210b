"""Write scikit-learn's handwritten digits as a 10-class ImageNet-layout image set.

The 1,797 8x8 grayscale digits (``sklearn.datasets.load_digits``, values 0..16;
shipped inside scikit-learn, nothing is downloaded) are upscaled to
``size x size`` (bicubic) and saved as PNGs, split per class into a training
and a held-out part (the first ``val_fraction`` of each class, in the set's
order, is held out)::

    OUT/train/<digit>/<i>.png      OUT/val/<digit>/<i>.png
    OUT/meta/train.txt             "<digit>/<i>.png <label>" per line
    OUT/meta/val.txt               the same for val
    OUT/meta/classes.txt           0 .. 9

The output is deterministic. Real labelled data for the class-conditional
DiT demo (``configs/generation/dit-tiny-4_polapp_1xb32-2k_demo-shapes-32.py``
with ``--cfg-options data_root=... model.dit.num_classes=10``):

    python tools/misc/make_demo_digits.py data/demo_digits32 --size 32
"""
import argparse
import os
import os.path as osp
from typing import Dict, Tuple

import numpy as np
from PIL import Image

NUM_CLASSES = 10


def load_digit_images(size: int = 32) -> Tuple[np.ndarray, np.ndarray]:
    """All digits upscaled: uint8 ``(N, size, size)`` images and int64 ``(N,)`` labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    small = np.clip(np.round(digits.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    images = np.stack([np.asarray(Image.fromarray(img, 'L').resize((size, size), Image.BICUBIC))
                       for img in small])
    return images, digits.target.astype(np.int64)


def split_indices(labels: np.ndarray, val_fraction: float) -> Tuple[np.ndarray, np.ndarray]:
    """``(train, val)`` indices: the first ``val_fraction`` of each class goes to val."""
    train, val = [], []
    for label in range(NUM_CLASSES):
        members = np.flatnonzero(labels == label)
        n_val = int(round(val_fraction * members.size))
        val.extend(members[:n_val].tolist())
        train.extend(members[n_val:].tolist())
    return np.asarray(sorted(train)), np.asarray(sorted(val))


def make_demo_digits(out_dir: str, size: int = 32, val_fraction: float = 0.2) -> Dict[str, int]:
    """Write the set; returns ``{'train': n, 'val': n}``."""
    if size < 8:
        raise ValueError(f'size must be >= 8 (the digits are 8x8), got {size}')
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f'val_fraction must be in (0, 1), got {val_fraction}')
    images, labels = load_digit_images(size)
    counts = {}
    os.makedirs(osp.join(out_dir, 'meta'), exist_ok=True)
    for split, indices in zip(('train', 'val'), split_indices(labels, val_fraction)):
        lines = []
        for label in range(NUM_CLASSES):
            os.makedirs(osp.join(out_dir, split, str(label)), exist_ok=True)
        for i in indices:
            name = f'{labels[i]}/{i:04d}.png'
            Image.fromarray(images[i], 'L').convert('RGB').save(osp.join(out_dir, split, name))
            lines.append(f'{name} {labels[i]}')
        with open(osp.join(out_dir, 'meta', f'{split}.txt'), 'w') as f:
            f.write('\n'.join(lines) + '\n')
        counts[split] = len(lines)
    with open(osp.join(out_dir, 'meta', 'classes.txt'), 'w') as f:
        f.write('\n'.join(str(c) for c in range(NUM_CLASSES)) + '\n')
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('out_dir')
    parser.add_argument('--size', type=int, default=32, help='side of the upscaled images')
    parser.add_argument('--val-fraction', type=float, default=0.2, help='share of each class held out')
    args = parser.parse_args()
    counts = make_demo_digits(args.out_dir, args.size, args.val_fraction)
    print(f"wrote {counts['train']} train / {counts['val']} val digit images "
          f'({args.size}x{args.size}) to {args.out_dir}')


if __name__ == '__main__':
    main()
