"""Generate a small semantic-segmentation set in the ADE20K layout.

Layout (as mmseg's ``ADE20KDataset`` reads ``ADEChallengeData2016``)::

    OUT/images/training/demo_<i>.jpg        RGB images
    OUT/images/validation/demo_<i>.jpg
    OUT/annotations/training/demo_<i>.png   8-bit label maps, same size as the image
    OUT/annotations/validation/demo_<i>.png
    OUT/classes.txt                         class names, one per line (label value 1, 2, ...)

Label values follow ADE20K's ``reduce_zero_label`` convention: 0 is "other"
(unlabelled: the one-pixel rim around every shape and the grey clutter blobs),
and the classes are 1..K; with ``reduce_zero_label=True`` mmseg maps 0 to the
ignore index 255 and class k to k - 1.

Each image is a small outdoor-like scene: a textured sky above a textured
grass field with a wavy horizon, and one to three shapes (disk, box, triangle)
with jittered colours and their own noise texture. Sizes vary and are not
multiples of 32. The output is deterministic for a given seed.

    python tools/misc/make_demo_ade20k.py data/demo_ade20k
"""
import argparse
import os
import os.path as osp

import numpy as np
from PIL import Image

CLASSES = ('sky', 'grass', 'disk', 'box', 'triangle')
PALETTE = ((70, 130, 220), (60, 170, 60), (220, 60, 40), (230, 200, 40), (170, 60, 200))
OTHER = 0  # ADE20K's "other" label, ignored with reduce_zero_label


def _texture(rng: np.random.Generator, h: int, w: int, base, amplitude: float, stripes: bool) -> np.ndarray:
    """``(h, w, 3)`` float image: ``base`` colour with pixel noise and optional diagonal stripes."""
    base = np.clip(np.asarray(base, np.float32) + rng.uniform(-25, 25, 3), 0, 255)
    img = np.broadcast_to(base, (h, w, 3)).copy()
    img += rng.normal(0, amplitude, (h, w, 1)) + rng.normal(0, amplitude / 3, (h, w, 3))
    if stripes:
        yy, xx = np.mgrid[0:h, 0:w]
        period = rng.uniform(4, 8)
        img += (12 * np.sin(2 * np.pi * (xx + yy * rng.uniform(-1, 1)) / period))[..., None]
    return img


def _shape_mask(kind: str, h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32) + 0.5
    r = rng.uniform(0.14, 0.3) * min(h, w)
    cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
    if kind == 'disk':
        return (xx - cx) ** 2 + (yy - cy) ** 2 < r ** 2
    if kind == 'box':
        a, b = r * rng.uniform(0.7, 1.0), r * rng.uniform(0.6, 1.0)
        return (np.abs(xx - cx) < a) & (np.abs(yy - cy) < b)
    # triangle pointing up: apex (cx, cy - r), base corners (cx -+ r, cy + r)
    inside_base = yy < cy + r
    half_width = (yy - (cy - r)) / 2  # grows from 0 at the apex to r at the base
    return inside_base & (yy > cy - r) & (np.abs(xx - cx) < half_width)


def _rim(mask: np.ndarray) -> np.ndarray:
    """The mask's pixels with a 4-neighbour outside the mask (a one-pixel inner boundary)."""
    padded = np.pad(mask, 1, constant_values=False)
    eroded = (padded[1:-1, 1:-1] & padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2]
              & padded[1:-1, 2:])
    return mask & ~eroded


def draw_scene(h: int, w: int, rng: np.random.Generator):
    """One image ``(h, w, 3) uint8`` and its label map ``(h, w) uint8`` (0 other, classes 1..5)."""
    yy, xx = np.mgrid[0:h, 0:w]
    horizon = h * rng.uniform(0.35, 0.65) + h * 0.08 * np.sin(
        2 * np.pi * xx / (w * rng.uniform(0.6, 1.4)) + rng.uniform(0, 2 * np.pi))
    sky = yy < horizon
    label = np.where(sky, 1, 2).astype(np.uint8)
    img = np.where(sky[..., None],
                   _texture(rng, h, w, PALETTE[0], 10, stripes=False) - (yy / h * 40)[..., None],
                   _texture(rng, h, w, PALETTE[1], 18, stripes=True))
    # unlabelled clutter: a grey blob in about half the scenes
    if rng.random() < 0.5:
        mask = _shape_mask('disk', h, w, rng)
        img[mask] = _texture(rng, h, w, (128, 128, 128), 25, stripes=False)[mask]
        label[mask] = OTHER
    for _ in range(rng.integers(1, 4)):
        cls = int(rng.integers(2, len(CLASSES)))  # 2..4 -> disk, box, triangle
        mask = _shape_mask(CLASSES[cls], h, w, rng)
        img[mask] = _texture(rng, h, w, PALETTE[cls], 14, stripes=bool(rng.random() < 0.5))[mask]
        label[mask] = cls + 1
        label[_rim(mask)] = OTHER
    return np.clip(img, 0, 255).astype(np.uint8), label


def make_demo_ade20k(out_dir: str, num_train: int = 48, num_val: int = 16, min_size: int = 56,
                     max_size: int = 104, seed: int = 0) -> dict:
    """Write the data set; returns ``dict(training=n, validation=n, classes=[...], palette=[...])``."""
    if num_train < 1 or num_val < 1:
        raise ValueError(f'num_train and num_val must be positive, got {num_train} and {num_val}')
    if not 16 <= min_size <= max_size:
        raise ValueError(f'need 16 <= min_size <= max_size, got min_size={min_size}, max_size={max_size}')
    rng = np.random.default_rng(seed)
    for split, count in (('training', num_train), ('validation', num_val)):
        img_dir = osp.join(out_dir, 'images', split)
        ann_dir = osp.join(out_dir, 'annotations', split)
        os.makedirs(img_dir, exist_ok=True)
        os.makedirs(ann_dir, exist_ok=True)
        for i in range(count):
            h, w = (int(s) for s in rng.integers(min_size, max_size + 1, size=2))
            img, label = draw_scene(h, w, rng)
            name = f'demo_{split[0]}{i:04d}'
            Image.fromarray(img, 'RGB').save(osp.join(img_dir, name + '.jpg'), quality=92)
            Image.fromarray(label, 'L').save(osp.join(ann_dir, name + '.png'))
    with open(osp.join(out_dir, 'classes.txt'), 'w') as f:
        f.write('\n'.join(CLASSES) + '\n')
    return dict(training=num_train, validation=num_val, classes=list(CLASSES),
                palette=[list(p) for p in PALETTE])


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Generate a small ADE20K-format segmentation set')
    parser.add_argument('out_dir', help='output folder (data root)')
    parser.add_argument('--num-train', type=int, default=48)
    parser.add_argument('--num-val', type=int, default=16)
    parser.add_argument('--min-size', type=int, default=56, help='smallest image side')
    parser.add_argument('--max-size', type=int, default=104, help='largest image side')
    parser.add_argument('--seed', type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    info = make_demo_ade20k(args.out_dir, args.num_train, args.num_val, args.min_size, args.max_size,
                            args.seed)
    print(f"wrote {info['training']} training and {info['validation']} validation images "
          f"({len(info['classes'])} classes: {', '.join(info['classes'])}) to {args.out_dir}")


if __name__ == '__main__':
    main()
