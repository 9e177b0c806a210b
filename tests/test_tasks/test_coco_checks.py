"""CheckedCocoDataset: the same data as mmdet's CocoDataset, clear errors for broken
COCO annotation files, missing files and wrong classes."""
import os
import os.path as osp

import pytest

from detection_testing import CLASSES, broken_copy, demo_coco, one_thread, set_category, use_mmdet  # noqa: F401 (fixtures)


def dataset_cfg(root, ann='annotations/instances_train.json', split='train', **kwargs):
    cfg = dict(type='CheckedCocoDataset', data_root=root, ann_file=ann,
               data_prefix=dict(img=f'{split}/'), metainfo=dict(classes=CLASSES),
               filter_cfg=dict(filter_empty_gt=True, min_size=32),
               pipeline=[dict(type='LoadImageFromFile')])
    cfg.update(kwargs)
    return cfg


def build_dataset(cfg):
    use_mmdet()
    from mmdet.registry import DATASETS
    return DATASETS.build(cfg)


def test_checked_dataset_matches_coco_dataset(demo_coco):
    dataset = build_dataset(dataset_cfg(demo_coco))
    plain = build_dataset(dict(dataset_cfg(demo_coco), type='CocoDataset'))
    assert len(dataset) == len(plain) == 32
    assert [d['instances'] for d in dataset.data_list] == [d['instances'] for d in plain.data_list]


def _no_images(coco):
    coco['images'] = []
    coco['annotations'] = []


def _no_annotations(coco):
    coco['annotations'] = []


def _no_bbox(coco):
    del coco['annotations'][0]['bbox']


def _bad_image_id(coco):
    coco['annotations'][1]['image_id'] = 999


def _dup_category(coco):
    coco['categories'].append(dict(coco['categories'][0]))


@pytest.mark.parametrize('edit, error, words', [
    (set_category, ValueError, ["category_id that is not in 'categories'", 'category_id 42',
                                 'annotation id 4', 'Expected one of the category ids [1, 2, 3]']),
    (_no_images, ValueError, ['lists no images']),
    (_no_annotations, ValueError, ['no image is left after filter_cfg', "'disk'"]),
    (_no_bbox, ValueError, ['malformed annotations', 'annotations[0]']),
    (_bad_image_id, ValueError, ["image_id that is not in 'images'", 'image_id 999']),
    (_dup_category, ValueError, ['duplicate category ids [1]']),
], ids=['wrong-category-id', 'no-images', 'nothing-after-filter', 'no-bbox', 'wrong-image-id',
        'duplicate-category'])
def test_broken_annotations_raise_clear_errors(demo_coco, tmp_path, edit, error, words):
    root = broken_copy(demo_coco, tmp_path, edit)
    with pytest.raises(error) as info:
        build_dataset(dataset_cfg(root))
    message = str(info.value)
    assert 'instances_train.json' in message, message
    for w in words:
        assert w in message, message


def test_missing_files_raise_clear_errors(demo_coco, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"ann_file '.*annotations/nope.json' does not exist"):
        build_dataset(dataset_cfg(demo_coco, ann='annotations/nope.json'))
    root = broken_copy(demo_coco, tmp_path, lambda coco: None)
    os.remove(osp.join(root, 'train', '000005.jpg'))
    with pytest.raises(FileNotFoundError, match=r"1 of the 32 images .* do not exist .*000005.jpg"):
        build_dataset(dataset_cfg(root))
    assert len(build_dataset(dataset_cfg(root, check_images=False))) == 32


def test_wrong_classes_and_bad_json_raise_clear_errors(demo_coco, tmp_path):
    with pytest.raises(ValueError, match=r"1 of the dataset's 2 classes, \['cat'\], are not "
                       r"category names .*\['disk', 'square', 'triangle'\]"):
        build_dataset(dataset_cfg(demo_coco, metainfo=dict(classes=('disk', 'cat'))))
    # the val split in test mode: no filtering, every image kept
    assert len(build_dataset(dataset_cfg(demo_coco, ann='annotations/instances_val.json',
                                         split='val', test_mode=True))) == 12
    bad = tmp_path / 'bad.json'
    bad.write_text('{"images": [')
    with pytest.raises(ValueError, match='is not valid JSON'):
        build_dataset(dataset_cfg(demo_coco, ann=str(bad)))
    bad.write_text('{"images": [{"id": 1}], "annotations": [{"id": 1}], "categories": []}')
    with pytest.raises(ValueError, match='is not a COCO annotation file'):
        build_dataset(dataset_cfg(demo_coco, ann=str(bad)))
