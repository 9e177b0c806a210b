"""Semantic-segmentation data with early, clear errors (mmseg scope).

mmseg's datasets accept an empty split (the failure comes later, as a numpy
error while serialising the data list, or as a training loop that never gets
a batch) and label maps that do not match their image (the failure comes
later, as a tensor-size mismatch deep in a crop, the loss or the metric, or
not at all). This module fails at the source instead:

* ``CheckedADE20KDataset`` (ADE20K's 150 classes, ``reduce_zero_label=True``)
  and ``CheckedSegDataset`` (any class list, e.g. the demo set) raise on a
  missing image folder, an empty split and images without a label file,
  naming the folders, suffixes and files.
* The ``CheckSegMapShape`` transform, placed right after ``LoadAnnotations``,
  raises when a label map is not a single-channel map of the image's
  original size, naming both files and both sizes. Images without an
  annotation (mmseg's inference APIs on a plain image) pass unchecked.

Import it through the config::

    custom_imports = dict(imports=['polaformerpp', 'polaformerpp.datasets.seg_checks'],
                          allow_failed_imports=False)
"""
import os.path as osp
from typing import List

from mmcv.transforms import BaseTransform
from mmseg.datasets import ADE20KDataset, BaseSegDataset
from mmseg.registry import DATASETS, TRANSFORMS

__all__ = ['CheckedADE20KDataset', 'CheckedSegDataset', 'CheckSegMapShape']


class _SplitChecksMixin:
    """``load_data_list`` that refuses a missing folder, an empty split and missing label files."""

    def load_data_list(self) -> List[dict]:
        name = type(self).__name__
        img_dir = self.data_prefix.get('img_path', '') or ''
        seg_dir = self.data_prefix.get('seg_map_path', None)
        local = self.backend_args is None
        uses_list_file = bool(self.ann_file) and not osp.isdir(self.ann_file)
        if local and uses_list_file and not osp.isfile(self.ann_file):
            raise FileNotFoundError(f'{name}: ann_file {self.ann_file!r} (the split list) does not exist')
        if local and not uses_list_file and not osp.isdir(img_dir):
            raise FileNotFoundError(
                f'{name}: image folder {img_dir!r} does not exist (data_root={self.data_root!r}, '
                f"data_prefix['img_path']={self.data_prefix.get('img_path')!r})")
        data_list = super().load_data_list()
        if not data_list:
            where = f'listed in {self.ann_file!r}' if uses_list_file else f'under {img_dir!r}'
            raise ValueError(
                f'{name}: the split is empty: no images ending in {self.img_suffix!r} {where} '
                f'(check data_root, data_prefix and img_suffix)')
        if local and seg_dir is not None:
            missing = [info for info in data_list
                       if 'seg_map_path' in info and not osp.isfile(info['seg_map_path'])]
            if missing:
                examples = ', '.join(f"{info['img_path']} -> {info['seg_map_path']}"
                                     for info in missing[:3])
                raise FileNotFoundError(
                    f'{name}: {len(missing)} of {len(data_list)} images have no label map '
                    f'(expected <image name>{self.seg_map_suffix} under {seg_dir!r}), e.g. {examples}')
        return data_list


@DATASETS.register_module()
class CheckedADE20KDataset(_SplitChecksMixin, ADE20KDataset):
    """mmseg's ``ADE20KDataset`` (150 classes, ``.jpg``/``.png``, ``reduce_zero_label=True``)
    with clear errors for a missing folder, an empty split or missing label maps."""


@DATASETS.register_module()
class CheckedSegDataset(_SplitChecksMixin, BaseSegDataset):
    """mmseg's ``BaseSegDataset`` (classes from ``metainfo``) with the same checks.

    Use it for ADE20K-format data with another class list, e.g.
    ``dict(type='CheckedSegDataset', metainfo=dict(classes=(...)), reduce_zero_label=True,
    img_suffix='.jpg', seg_map_suffix='.png', ...)``.
    """


@TRANSFORMS.register_module()
class CheckSegMapShape(BaseTransform):
    """Check that ``gt_seg_map`` is a single-channel map of the image's original size.

    Place it right after ``LoadAnnotations`` (before any transform that
    changes the label map's geometry). It compares with ``ori_shape``, the
    size of the decoded image, so it also works after a test-time ``Resize``.

    The rule: the check runs where an annotation was asked for, i.e. where
    the results carry a ``seg_map_path`` (set by the dataset for every image
    of a split with a label folder) or a ``gt_seg_map``:

    * neither key (or ``seg_map_path=None``): a plain image, as mmseg's
      ``inference_model`` and ``MMSegInferencer`` feed it after removing
      ``LoadAnnotations`` from the test pipeline -> the results pass unchanged;
    * a ``seg_map_path`` but no ``gt_seg_map``: the label map was not loaded
      (``LoadAnnotations`` missing or after this check) -> ``KeyError``;
    * a ``gt_seg_map`` that is not ``(H, W)`` or not of the image's size -> ``ValueError``.

    A missing label file is refused before this, by the checked datasets
    (while listing the split) and by ``LoadAnnotations`` (when reading it).

    Keys read: ``gt_seg_map``, ``seg_map_path``, ``ori_shape`` (or ``img_shape``), ``img_path``.
    """

    def transform(self, results: dict) -> dict:
        seg = results.get('gt_seg_map')
        if seg is None:
            if results.get('seg_map_path') is None:
                return results  # no annotation asked for: inference on a plain image
            raise KeyError(f'CheckSegMapShape needs results["gt_seg_map"] for label map '
                           f'{results["seg_map_path"]}: put it after LoadAnnotations')
        shape = results.get('ori_shape', results.get('img_shape'))
        img_path = results.get('img_path', '<image>')
        seg_path = results.get('seg_map_path', '<label map>')
        if seg.ndim != 2:
            raise ValueError(f'label map {seg_path} has shape {tuple(seg.shape)}: expected a single-channel '
                             f'(H, W) map of class indices for image {img_path}')
        if tuple(seg.shape) != tuple(shape[:2]):
            raise ValueError(f'label map {seg_path} is {seg.shape[0]}x{seg.shape[1]} (HxW) but its image '
                             f'{img_path} is {shape[0]}x{shape[1]}: a label map must have the size of its '
                             f'image')
        return results

    def __repr__(self) -> str:
        return f'{type(self).__name__}()'
