"""COCO-format detection data with up-front checks: broken annotations fail early and clearly.

mmdet's ``CocoDataset`` trusts its annotation file: an annotation whose
``category_id`` is not among the file's categories is dropped silently, class
names that match no category leave every image without instances (and an
empty training set), a missing image surfaces as an I/O error inside a data
loader worker in the middle of an epoch, and a malformed file fails with a
``KeyError`` deep in pycocotools. :class:`CheckedCocoDataset` is the same
dataset (same arguments, same data and evaluation) that validates the file
when it loads it and raises ``FileNotFoundError`` / ``ValueError`` naming the
file, the offending entries and the expected values.

Importing this module registers the class in mmdet's ``DATASETS``; configs
list it in ``custom_imports``::

    custom_imports = dict(imports=['polaformerpp', 'polaformerpp.datasets.coco_checks'],
                          allow_failed_imports=False)
    train_dataloader = dict(dataset=dict(type='CheckedCocoDataset', ...))
"""
import json
import math
import os.path as osp
from numbers import Number
from typing import Dict, List

from mmdet.datasets import CocoDataset
from mmdet.registry import DATASETS
from mmengine import fileio

__all__ = ['CheckedCocoDataset', 'CocoAnnotationError']

# how many offending entries an error message lists
_MAX_LISTED = 5


class CocoAnnotationError(ValueError):
    """A COCO annotation file (or the images it names) does not match what the dataset expects."""


def _listing(items: List[str], total: int) -> str:
    more = f' (and {total - len(items)} more)' if total > len(items) else ''
    return '; '.join(items) + more


@DATASETS.register_module()
class CheckedCocoDataset(CocoDataset):
    """mmdet's ``CocoDataset`` that validates its annotation file and images.

    Checks, in this order, each with an error that names the file and the
    offending entries:

    * ``ann_file`` exists, is JSON, and has the COCO structure (``images``,
      ``categories`` and, unless ``test_mode``, ``annotations``);
    * the file lists at least one image, each with ``id``, ``file_name``,
      ``width`` and ``height``;
    * category ids and names are unique, and every class name of the dataset's
      ``metainfo['classes']`` is one of the file's category names;
    * every annotation has ``id``, ``image_id``, ``category_id`` and a 4-number
      ``bbox``; its ``image_id`` is one of the images and its ``category_id``
      one of the categories;
    * (``check_images=True``) every image file exists (local storage only);
    * at least one image is left after ``filter_cfg`` (otherwise training would
      run on an empty set).

    Annotations of categories that are in the file but not among the selected
    ``classes`` are skipped, as ``CocoDataset`` does (training on a subset of
    the classes).

    Args:
        check_images (bool): check that every image file exists. Default True.
        **kwargs: the arguments of ``mmdet.datasets.CocoDataset``.
    """

    def __init__(self, *args, check_images: bool = True, **kwargs):
        self.check_images = check_images
        super().__init__(*args, **kwargs)

    # --------------------------------------------------------------- loading
    def load_data_list(self) -> List[dict]:
        coco = self._load_api()
        self._check_structure(coco.dataset)
        # hand the already loaded and checked API to CocoDataset's loader
        self.COCOAPI = lambda _path: coco
        try:
            data_list = super().load_data_list()
        finally:
            del self.COCOAPI
        if self.check_images:
            self._check_image_files(data_list)
        return data_list

    def filter_data(self) -> List[dict]:
        data_list = super().filter_data()
        if not data_list:
            raise CocoAnnotationError(
                f"{self._name}: no image is left after filter_cfg={self.filter_cfg} out of "
                f"{len(self.data_list)} in ann_file '{self.ann_file}': none has an annotation of "
                f"the classes {tuple(self.metainfo['classes'])} (category ids {list(self.cat_ids)}) "
                f"that is large enough. Check ann_file, metainfo.classes and filter_cfg.")
        return data_list

    # ---------------------------------------------------------------- checks
    @property
    def _name(self) -> str:
        return type(self).__name__

    def _load_api(self):
        if not self.ann_file:
            raise CocoAnnotationError(f'{self._name}: ann_file is empty; expected the path of a '
                                      f'COCO json file (e.g. annotations/instances_train2017.json)')
        if not fileio.exists(self.ann_file, backend_args=self.backend_args):
            raise FileNotFoundError(
                f"{self._name}: ann_file '{self.ann_file}' does not exist (ann_file is joined to "
                f"data_root={self.data_root!r}); expected a COCO json file")
        with fileio.get_local_path(self.ann_file, backend_args=self.backend_args) as local_path:
            try:
                return self.COCOAPI(local_path)
            except json.JSONDecodeError as e:
                raise CocoAnnotationError(
                    f"{self._name}: ann_file '{self.ann_file}' is not valid JSON: {e}") from e
            except (KeyError, TypeError, AssertionError, AttributeError) as e:
                raise CocoAnnotationError(
                    f"{self._name}: ann_file '{self.ann_file}' is not a COCO annotation file "
                    f"({type(e).__name__}: {e}); expected a dict with 'images', 'annotations' "
                    f"and 'categories', each annotation with 'id', 'image_id', 'category_id', "
                    f"'bbox'") from e

    def _fail(self, what: str, problems: List[str], total: int, expected: str):
        raise CocoAnnotationError(
            f"{self._name}: ann_file '{self.ann_file}': {total} {what}: "
            f"{_listing(problems, total)}. {expected}")

    def _check_structure(self, dataset: Dict):
        required = ['images', 'categories'] + ([] if self.test_mode else ['annotations'])
        missing = [key for key in required if not isinstance(dataset.get(key), list)]
        if missing:
            self._fail('top-level entries missing or not lists', [repr(k) for k in missing],
                       len(missing), "Expected a COCO dict with the lists 'images', "
                       "'annotations' and 'categories'.")

        images = dataset['images']
        if not images:
            raise CocoAnnotationError(
                f"{self._name}: ann_file '{self.ann_file}' lists no images ('images' is empty); "
                f"expected at least one image")
        bad = [f'images[{i}]' for i, img in enumerate(images)
               if not isinstance(img, dict) or not {'id', 'file_name', 'width', 'height'} <= set(img)]
        if bad:
            self._fail('images without id/file_name/width/height', bad[:_MAX_LISTED], len(bad),
                       'Every image needs id, file_name, width and height.')
        image_ids = {img['id'] for img in images}

        categories = dataset['categories']
        cat_ids = [cat.get('id') for cat in categories if isinstance(cat, dict)]
        names = [cat.get('name') for cat in categories if isinstance(cat, dict)]
        if len(cat_ids) != len(categories) or None in cat_ids or None in names:
            raise CocoAnnotationError(
                f"{self._name}: ann_file '{self.ann_file}': every entry of 'categories' needs "
                f"an 'id' and a 'name', got {categories[:_MAX_LISTED]}")
        for label, values in (('ids', cat_ids), ('names', names)):
            dups = sorted({v for v in values if values.count(v) > 1}, key=str)
            if dups:
                raise CocoAnnotationError(
                    f"{self._name}: ann_file '{self.ann_file}': duplicate category {label} {dups}")
        classes = tuple(self.metainfo.get('classes') or ())
        unknown = [c for c in classes if c not in names]
        if unknown:
            listed = unknown if len(unknown) <= 10 else unknown[:10] + [f'... {len(unknown) - 10} more']
            raise CocoAnnotationError(
                f"{self._name}: {len(unknown)} of the dataset's {len(classes)} classes, {listed}, "
                f"are not category names of ann_file '{self.ann_file}', whose categories are "
                f"{names[:_MAX_LISTED * 4]} (ids {cat_ids[:_MAX_LISTED * 4]}"
                f"{', ...' if len(names) > _MAX_LISTED * 4 else ''}); set metainfo=dict(classes=...) "
                f"to names from the file")

        cat_id_set = set(cat_ids)
        malformed, bad_image, bad_category = [], [], []
        for i, ann in enumerate(dataset.get('annotations') or []):
            if not isinstance(ann, dict) or not {'id', 'image_id', 'category_id', 'bbox'} <= set(ann):
                malformed.append(f'annotations[{i}] (needs id, image_id, category_id, bbox)')
                continue
            bbox = ann['bbox']
            if (not isinstance(bbox, (list, tuple)) or len(bbox) != 4
                    or not all(isinstance(v, Number) and math.isfinite(v) for v in bbox)):
                malformed.append(f"annotation id {ann['id']}: bbox {bbox!r} (expected [x, y, w, h])")
            if ann['image_id'] not in image_ids:
                bad_image.append(f"annotation id {ann['id']} -> image_id {ann['image_id']!r}")
            if ann['category_id'] not in cat_id_set:
                bad_category.append(f"annotation id {ann['id']} -> category_id {ann['category_id']!r}")
        if malformed:
            self._fail('malformed annotations', malformed[:_MAX_LISTED], len(malformed),
                       'Each annotation needs id, image_id, category_id and bbox [x, y, w, h].')
        if bad_category:
            self._fail("annotations with a category_id that is not in 'categories'",
                       bad_category[:_MAX_LISTED], len(bad_category),
                       f'Expected one of the category ids {sorted(cat_id_set, key=str)}.')
        if bad_image:
            self._fail("annotations with an image_id that is not in 'images'",
                       bad_image[:_MAX_LISTED], len(bad_image),
                       "Expected one of the image ids of 'images'.")

    def _check_image_files(self, data_list: List[dict]):
        backend = (self.backend_args or {}).get('backend', 'local')
        if backend != 'local':
            return
        missing = [info['img_path'] for info in data_list if not osp.isfile(info['img_path'])]
        if missing:
            raise FileNotFoundError(
                f"{self._name}: {len(missing)} of the {len(data_list)} images of ann_file "
                f"'{self.ann_file}' do not exist under data_prefix={self.data_prefix} "
                f"(data_root={self.data_root!r}): {_listing(missing[:_MAX_LISTED], len(missing))}")
