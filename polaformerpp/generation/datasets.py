"""Class-labelled image folders (ImageNet layout) for generative training.

Reads either an annotation file of ``"<relative path> <label>"`` lines (the
mmpretrain ImageNet ``meta/train.txt`` format) or, without one, the
``<prefix>/<class>/<image>`` tree with classes in sorted order. Images are
center-cropped ADM-style (downsample by halving with a box filter while the
short side is at least twice the target, bicubic to the target short side,
center crop) and optionally flipped horizontally.
"""
import os
import os.path as osp
import random
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from mmengine.registry import DATASETS
from PIL import Image
from torch.utils.data import Dataset

from .sampling import random_class_labels

__all__ = ['ClassImageFolder', 'RandomClassLabels', 'center_crop_image']

IMG_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif', '.tiff', '.webp')


def center_crop_image(img: Image.Image, size: int) -> np.ndarray:
    """ADM's center crop: RGB PIL image -> uint8 ``(size, size, 3)``."""
    while min(img.size) >= 2 * size:
        img = img.resize(tuple(s // 2 for s in img.size), resample=Image.BOX)
    scale = size / min(img.size)
    img = img.resize(tuple(round(s * scale) for s in img.size), resample=Image.BICUBIC)
    arr = np.asarray(img.convert('RGB'))
    top, left = (arr.shape[0] - size) // 2, (arr.shape[1] - size) // 2
    return arr[top:top + size, left:left + size]


@DATASETS.register_module()
class ClassImageFolder(Dataset):
    """Images with class labels, returned as uint8 tensors for diffusion training.

    Args:
        data_root (str): root folder.
        data_prefix (str): image folder under ``data_root`` (e.g. ``'train'``).
        ann_file (str): optional ``"<path> <label>"`` list under ``data_root``;
            paths are relative to ``data_root/data_prefix``.
        classes (str | list, optional): class names or a file with one per line
            (under ``data_root``); only for metadata.
        image_size (int): side of the square crops.
        random_flip (bool): horizontal flip with probability 0.5.
        indices (int | list, optional): keep only the first ``n`` items or these indices.

    Items: ``dict(inputs=uint8 (3, S, S), data_samples=dict(gt_label, img_path))``.
    """

    def __init__(self, data_root: str = '', data_prefix: str = '', ann_file: str = '',
                 classes: Optional[Union[str, Sequence[str]]] = None, image_size: int = 256,
                 random_flip: bool = True, indices: Optional[Union[int, Sequence[int]]] = None,
                 test_mode: bool = False):
        if image_size < 1:
            raise ValueError(f'image_size must be positive, got {image_size}')
        self.image_size = image_size
        self.random_flip = random_flip and not test_mode
        self.img_dir = osp.join(data_root, data_prefix)
        if not osp.isdir(self.img_dir):
            raise FileNotFoundError(f'ClassImageFolder: image folder {self.img_dir!r} not found '
                                    f'(data_root={data_root!r}, data_prefix={data_prefix!r})')
        if ann_file:
            self.samples, names = self._read_ann_file(osp.join(data_root, ann_file)), None
        else:
            self.samples, names = self._scan_folders()
        self.classes = self._read_classes(data_root, classes) or names
        if indices is not None:
            keep = range(min(indices, len(self.samples))) if isinstance(indices, int) else indices
            self.samples = [self.samples[i] for i in keep]
        if not self.samples:
            raise ValueError(f'ClassImageFolder: no images found under {self.img_dir!r}')

    def _read_ann_file(self, path: str) -> List[Tuple[str, int]]:
        if not osp.isfile(path):
            raise FileNotFoundError(f'ClassImageFolder: ann_file {path!r} not found')
        samples = []
        with open(path) as f:
            for lineno, line in enumerate(f, 1):
                parts = line.strip().rsplit(maxsplit=1)
                if not parts:
                    continue
                if len(parts) != 2 or not parts[1].lstrip('-').isdigit():
                    raise ValueError(f'{path}:{lineno}: expected "<path> <label>", got {line.strip()!r}')
                samples.append((osp.join(self.img_dir, parts[0]), int(parts[1])))
        return samples

    def _scan_folders(self):
        names = sorted(d for d in os.listdir(self.img_dir) if osp.isdir(osp.join(self.img_dir, d)))
        samples = []
        for label, name in enumerate(names):
            folder = osp.join(self.img_dir, name)
            for fname in sorted(os.listdir(folder)):
                if fname.lower().endswith(IMG_EXTENSIONS):
                    samples.append((osp.join(folder, fname), label))
        return samples, names

    @staticmethod
    def _read_classes(data_root, classes):
        if classes is None:
            return None
        if isinstance(classes, str):
            with open(osp.join(data_root, classes)) as f:
                return [line.strip() for line in f if line.strip()]
        return list(classes)

    @property
    def metainfo(self) -> dict:
        return dict(classes=self.classes)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict:
        path, label = self.samples[index]
        with Image.open(path) as img:
            arr = center_crop_image(img.convert('RGB'), self.image_size)
        if self.random_flip and random.random() < 0.5:
            arr = arr[:, ::-1]
        inputs = torch.from_numpy(np.array(arr)).permute(2, 0, 1).contiguous()  # a writable copy
        return dict(inputs=inputs, data_samples=dict(gt_label=label, img_path=path))


@DATASETS.register_module()
class RandomClassLabels(Dataset):
    """Class labels only, drawn uniformly at random: what an FID-50K run samples.

    Items: ``dict(data_samples=dict(gt_label=int))``; the labels are
    :func:`~polaformerpp.generation.random_class_labels` of ``seed``, the same
    list that ``tools/generation/sample.py`` draws with that seed.
    """

    def __init__(self, num_samples: int = 50000, num_classes: int = 1000, seed: int = 0,
                 test_mode: bool = True):
        if num_samples < 1 or num_classes < 1:
            raise ValueError(f'num_samples and num_classes must be >= 1, got {num_samples}, {num_classes}')
        self.labels = random_class_labels(num_samples, num_classes, seed)
        self.num_classes = num_classes

    @property
    def metainfo(self) -> dict:
        return dict(classes=list(range(self.num_classes)))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict:
        return dict(data_samples=dict(gt_label=int(self.labels[index])))
