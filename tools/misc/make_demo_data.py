"""Generate a small ImageNet-format classification set of simple shapes.

Layout (as mmpretrain reads ImageNet)::

    OUT/train/<class>/<class>_<i>.JPEG
    OUT/val/val_<i>.JPEG
    OUT/meta/train.txt      "<class>/<file> <label>" per line
    OUT/meta/val.txt        "<file> <label>" per line
    OUT/meta/classes.txt    one class name per line

Each class is a shape with its own colour family on a noisy background, at a
random position, scale and hue offset, so a small network learns it in a few
epochs while chance stays at 1 / num_classes. The output is deterministic for
a given seed.

    python tools/misc/make_demo_data.py data/demo_in1k
"""
import argparse
import os
import os.path as osp

import numpy as np
from PIL import Image, ImageDraw

SHAPES = ('disk', 'square', 'triangle', 'cross', 'ring', 'bar')
COLORS = ((220, 40, 40), (40, 200, 60), (50, 70, 230), (230, 210, 40), (200, 60, 210), (40, 210, 210))


def draw_sample(shape_id: int, size: int, rng: np.random.Generator) -> Image.Image:
    """One ``size x size`` RGB image of shape ``SHAPES[shape_id]``."""
    background = rng.integers(0, 90, size=(size, size, 3), dtype=np.uint8)
    img = Image.fromarray(background, 'RGB')
    draw = ImageDraw.Draw(img)
    color = tuple(int(np.clip(c + rng.integers(-30, 31), 0, 255)) for c in COLORS[shape_id])
    r = rng.uniform(0.18, 0.32) * size
    cx, cy = rng.uniform(r, size - r, size=2)
    box = [cx - r, cy - r, cx + r, cy + r]
    name = SHAPES[shape_id]
    if name == 'disk':
        draw.ellipse(box, fill=color)
    elif name == 'square':
        draw.rectangle(box, fill=color)
    elif name == 'triangle':
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=color)
    elif name == 'cross':
        w = r / 3
        draw.rectangle([cx - w, cy - r, cx + w, cy + r], fill=color)
        draw.rectangle([cx - r, cy - w, cx + r, cy + w], fill=color)
    elif name == 'ring':
        draw.ellipse(box, outline=color, width=max(2, int(r / 3)))
    else:  # bar
        draw.rectangle([cx - r, cy - r / 4, cx + r, cy + r / 4], fill=color)
    return img


def make_demo_data(out_dir: str, num_classes: int = 4, train_per_class: int = 40,
                   val_per_class: int = 10, size: int = 64, seed: int = 0) -> dict:
    """Write the data set; returns ``{'train': n, 'val': n, 'classes': [...]}``."""
    if not 2 <= num_classes <= len(SHAPES):
        raise ValueError(f'num_classes must be in [2, {len(SHAPES)}], got {num_classes}')
    if train_per_class < 1 or val_per_class < 1:
        raise ValueError('train_per_class and val_per_class must be positive')
    rng = np.random.default_rng(seed)
    classes = [f'n{i:08d}_{SHAPES[i]}' for i in range(num_classes)]
    os.makedirs(osp.join(out_dir, 'meta'), exist_ok=True)
    os.makedirs(osp.join(out_dir, 'val'), exist_ok=True)
    train_lines, val_lines = [], []
    for label, cls in enumerate(classes):
        os.makedirs(osp.join(out_dir, 'train', cls), exist_ok=True)
        for i in range(train_per_class):
            name = f'{cls}_{i:04d}.JPEG'
            draw_sample(label, size, rng).save(osp.join(out_dir, 'train', cls, name), quality=90)
            train_lines.append(f'{cls}/{name} {label}')
    order = rng.permutation(num_classes * val_per_class)
    for j, idx in enumerate(order):
        label = int(idx) // val_per_class
        name = f'val_{j:05d}.JPEG'
        draw_sample(label, size, rng).save(osp.join(out_dir, 'val', name), quality=90)
        val_lines.append(f'{name} {label}')
    for fname, lines in (('train.txt', train_lines), ('val.txt', val_lines), ('classes.txt', classes)):
        with open(osp.join(out_dir, 'meta', fname), 'w') as f:
            f.write('\n'.join(lines) + '\n')
    return dict(train=len(train_lines), val=len(val_lines), classes=classes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('out_dir')
    parser.add_argument('--num-classes', type=int, default=4)
    parser.add_argument('--train-per-class', type=int, default=40)
    parser.add_argument('--val-per-class', type=int, default=10)
    parser.add_argument('--size', type=int, default=64)
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    info = make_demo_data(args.out_dir, args.num_classes, args.train_per_class,
                          args.val_per_class, args.size, args.seed)
    print(f"wrote {info['train']} train / {info['val']} val images of "
          f"{len(info['classes'])} classes to {args.out_dir}")


if __name__ == '__main__':
    main()
