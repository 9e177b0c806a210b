"""Generate a small COCO-format detection / instance-segmentation set of simple shapes.

Layout (as mmdet's ``CocoDataset`` reads COCO)::

    OUT/train/<id>.jpg                       real JPEG images, sizes vary
    OUT/val/<id>.jpg
    OUT/annotations/instances_train.json     COCO json: images, annotations, categories
    OUT/annotations/instances_val.json

Each image holds one to ``max_objects`` non-overlapping filled shapes (disk,
square, triangle, diamond; one colour family per category) on a noisy
background. Every shape is drawn as the polygon that is stored as its mask,
so boxes (``[x, y, w, h]``), polygon masks and areas are exact;
``iscrowd`` is 0. Image sizes are random and generally not multiples of 32.
Category ids start at 1 as in COCO. The output is deterministic for a seed.

    python tools/misc/make_demo_coco.py data/demo_coco
    python tools/misc/make_demo_coco.py data/demo_coco --train 40 --val 12 --num-classes 3
"""
import argparse
import json
import math
import os
import os.path as osp

import numpy as np
from PIL import Image, ImageDraw

SHAPES = ('disk', 'square', 'triangle', 'diamond')
COLORS = ((225, 45, 45), (45, 205, 70), (55, 80, 235), (235, 205, 45))


def shape_polygon(name: str, cx: float, cy: float, r: float) -> list:
    """Vertices ``[(x, y), ...]`` of shape ``name`` centred at ``(cx, cy)`` with radius ``r``."""
    if name == 'disk':
        return [(cx + r * math.cos(2 * math.pi * i / 24), cy + r * math.sin(2 * math.pi * i / 24))
                for i in range(24)]
    if name == 'square':
        s = r * 0.85
        return [(cx - s, cy - s), (cx + s, cy - s), (cx + s, cy + s), (cx - s, cy + s)]
    if name == 'triangle':
        return [(cx, cy - r), (cx + r, cy + r * 0.8), (cx - r, cy + r * 0.8)]
    if name == 'diamond':
        return [(cx, cy - r), (cx + r * 0.7, cy), (cx, cy + r), (cx - r * 0.7, cy)]
    raise ValueError(f'unknown shape {name!r}; expected one of {SHAPES}')


def polygon_area(points: list) -> float:
    """Shoelace area of a simple polygon."""
    xs = np.array([p[0] for p in points])
    ys = np.array([p[1] for p in points])
    return float(0.5 * abs(np.dot(xs, np.roll(ys, -1)) - np.dot(ys, np.roll(xs, -1))))


def draw_image(width: int, height: int, num_classes: int, max_objects: int,
               rng: np.random.Generator):
    """One image and its objects ``[(category index, polygon), ...]``."""
    background = rng.integers(0, 80, size=(height, width, 3), dtype=np.uint8)
    img = Image.fromarray(background, 'RGB')
    draw = ImageDraw.Draw(img)
    objects, discs = [], []
    target = int(rng.integers(1, max_objects + 1))
    for _ in range(50 * target):  # rejection sampling of non-overlapping discs
        if len(objects) == target:
            break
        r = float(rng.uniform(0.13, 0.26) * min(width, height))
        cx = float(rng.uniform(r + 1, width - r - 1))
        cy = float(rng.uniform(r + 1, height - r - 1))
        if any(math.hypot(cx - x, cy - y) < r + s + 2 for x, y, s in discs):
            continue
        label = int(rng.integers(num_classes))
        polygon = shape_polygon(SHAPES[label], cx, cy, r)
        color = tuple(int(np.clip(c + rng.integers(-25, 26), 0, 255)) for c in COLORS[label])
        draw.polygon(polygon, fill=color)
        discs.append((cx, cy, r))
        objects.append((label, polygon))
    return img, objects


def make_split(out_dir: str, split: str, num_images: int, num_classes: int, min_size: int,
               max_size: int, max_objects: int, rng: np.random.Generator, first_ann_id: int = 1):
    """Write ``OUT/<split>/*.jpg`` and return the split's COCO dict."""
    os.makedirs(osp.join(out_dir, split), exist_ok=True)
    images, annotations = [], []
    ann_id = first_ann_id
    for img_id in range(1, num_images + 1):
        width, height = (int(v) for v in rng.integers(min_size, max_size + 1, size=2))
        img, objects = draw_image(width, height, num_classes, max_objects, rng)
        file_name = f'{img_id:06d}.jpg'
        img.save(osp.join(out_dir, split, file_name), quality=92)
        images.append(dict(id=img_id, file_name=file_name, width=width, height=height))
        for label, polygon in objects:
            xs = [p[0] for p in polygon]
            ys = [p[1] for p in polygon]
            x0, y0 = max(0.0, min(xs)), max(0.0, min(ys))
            x1, y1 = min(float(width), max(xs)), min(float(height), max(ys))
            annotations.append(dict(
                id=ann_id, image_id=img_id, category_id=label + 1,
                bbox=[round(x0, 2), round(y0, 2), round(x1 - x0, 2), round(y1 - y0, 2)],
                area=round(polygon_area(polygon), 2),
                segmentation=[[round(v, 2) for p in polygon for v in p]],
                iscrowd=0))
            ann_id += 1
    categories = [dict(id=i + 1, name=SHAPES[i], supercategory='shape') for i in range(num_classes)]
    return dict(info=dict(description=f'PolaFormer++ demo shapes ({split})', version='1.0'),
                licenses=[], images=images, annotations=annotations, categories=categories)


def make_demo_coco(out_dir: str, num_train: int = 32, num_val: int = 12, num_classes: int = 3,
                   min_size: int = 112, max_size: int = 176, max_objects: int = 3,
                   seed: int = 0) -> dict:
    """Write the data set; returns ``{'train': n, 'val': n, 'classes': (...), 'annotations': n}``."""
    if not 1 <= num_classes <= len(SHAPES):
        raise ValueError(f'num_classes must be in [1, {len(SHAPES)}], got {num_classes}')
    if num_train < 1 or num_val < 1:
        raise ValueError(f'num_train and num_val must be positive, got {num_train}, {num_val}')
    if not 48 <= min_size <= max_size:
        raise ValueError(f'need 48 <= min_size <= max_size, got {min_size}, {max_size}')
    if max_objects < 1:
        raise ValueError(f'max_objects must be positive, got {max_objects}')
    rng = np.random.default_rng(seed)
    os.makedirs(osp.join(out_dir, 'annotations'), exist_ok=True)
    total = 0
    for split, count in (('train', num_train), ('val', num_val)):
        coco = make_split(out_dir, split, count, num_classes, min_size, max_size, max_objects, rng)
        total += len(coco['annotations'])
        with open(osp.join(out_dir, 'annotations', f'instances_{split}.json'), 'w') as f:
            json.dump(coco, f)
    return dict(train=num_train, val=num_val, classes=SHAPES[:num_classes], annotations=total)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('out_dir')
    parser.add_argument('--train', type=int, default=32, help='number of training images')
    parser.add_argument('--val', type=int, default=12, help='number of validation images')
    parser.add_argument('--num-classes', type=int, default=3)
    parser.add_argument('--min-size', type=int, default=112, help='smallest image side')
    parser.add_argument('--max-size', type=int, default=176, help='largest image side')
    parser.add_argument('--max-objects', type=int, default=3, help='most shapes per image')
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    info = make_demo_coco(args.out_dir, args.train, args.val, args.num_classes, args.min_size,
                          args.max_size, args.max_objects, args.seed)
    print(f"wrote {info['train']} train / {info['val']} val images, {info['annotations']} "
          f"instances of {list(info['classes'])} to {args.out_dir}")


if __name__ == '__main__':
    main()
