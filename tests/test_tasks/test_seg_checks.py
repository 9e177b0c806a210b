"""ADE20K-format data: the demo generator's layout, the configs' pipelines on real
files, and the clear errors of the checked datasets (label size, empty or missing
split)."""
import glob
import os
import os.path as osp
import shutil

import numpy as np
import pytest
from mmengine.config import Config
from PIL import Image

from conftest import REPO_ROOT, load_tool
from segmentation_testing import (
    DEMO_CLASSES,
    DEMO_CONFIG,
    SEG_DIR,
    init_mmseg,
    single_thread,  # noqa: F401 (fixtures)
)


@pytest.fixture(scope='module')
def demo_ade(tmp_path_factory):
    make = load_tool('tools/misc/make_demo_ade20k.py').make_demo_ade20k
    root = str(tmp_path_factory.mktemp('demo_ade20k'))
    make(root, num_train=6, num_val=3, seed=1)
    return root


def test_demo_generator_writes_ade20k_layout(demo_ade, tmp_path):
    for split, count in (('training', 6), ('validation', 3)):
        imgs = sorted(glob.glob(osp.join(demo_ade, 'images', split, '*.jpg')))
        anns = sorted(glob.glob(osp.join(demo_ade, 'annotations', split, '*.png')))
        assert len(imgs) == len(anns) == count
        for img, ann in zip(imgs, anns):
            assert osp.basename(img)[:-4] == osp.basename(ann)[:-4]
            label = Image.open(ann)
            assert label.mode == 'L' and label.size == Image.open(img).size
            values = set(np.unique(np.asarray(label)).tolist())
            assert values <= set(range(len(DEMO_CLASSES) + 1))  # 0 other, classes 1..5
            assert {0, 1, 2} <= values  # rims are "other"; sky and grass are always there
    with open(osp.join(demo_ade, 'classes.txt')) as f:
        assert tuple(f.read().split()) == DEMO_CLASSES
    # deterministic per seed
    make = load_tool('tools/misc/make_demo_ade20k.py').make_demo_ade20k
    make(str(tmp_path), num_train=6, num_val=3, seed=1)
    for rel in ('annotations/training/demo_t0003.png', 'images/validation/demo_v0002.jpg'):
        with open(osp.join(demo_ade, rel), 'rb') as a, open(osp.join(tmp_path, rel), 'rb') as b:
            assert a.read() == b.read()


def _dataset(root, pipeline, split='training', type='CheckedADE20KDataset', **kwargs):
    init_mmseg()
    from mmseg.registry import DATASETS
    return DATASETS.build(dict(
        type=type, data_root=root, pipeline=pipeline,
        data_prefix=dict(img_path=f'images/{split}', seg_map_path=f'annotations/{split}'), **kwargs))


def test_ade20k_pipelines_on_ade20k_format_files(demo_ade):
    cfg = Config.fromfile(osp.join(SEG_DIR, 'polapp-b2_lightham_8xb8-160k_ade20k-512x512.py'))
    train = _dataset(demo_ade, cfg.train_pipeline)
    assert len(train) == 6 and train.metainfo['reduce_zero_label'] is True
    sample = train[0]
    h, w = sample['inputs'].shape[1:]
    assert h <= 512 and w <= 512  # resized to 0.5-2.0 of 2048x512, cropped to at most 512x512
    assert sample['data_samples'].gt_sem_seg.shape == (h, w)
    labels = set(sample['data_samples'].gt_sem_seg.data.unique().tolist())
    assert labels <= set(range(5)) | {255}  # reduce_zero_label: 0 -> 255, k -> k - 1

    test = _dataset(demo_ade, cfg.test_pipeline, 'validation', test_mode=True)
    sample = test[0]
    ori = Image.open(sample['data_samples'].img_path).size[::-1]
    assert sample['data_samples'].ori_shape == ori
    assert min(sample['inputs'].shape[1:]) == 512 or max(sample['inputs'].shape[1:]) == 2048
    assert sample['data_samples'].gt_sem_seg.shape == ori  # metrics at the original size

    tta = _dataset(demo_ade, cfg.tta_pipeline, 'validation', test_mode=True)
    views = tta[0]
    assert len(views['inputs']) == len(views['data_samples']) == 12  # 6 scales x 2 flips
    assert [s.flip for s in views['data_samples']].count(True) == 6
    assert all(s.gt_sem_seg.shape == ori for s in views['data_samples'])


def _copy_demo(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


def test_label_size_mismatch_is_a_clear_error(demo_ade, tmp_path):
    root = _copy_demo(demo_ade, tmp_path / 'data')
    png = sorted(glob.glob(osp.join(root, 'annotations', 'training', '*.png')))[0]
    label = Image.open(png)
    label.resize((label.width + 3, label.height), Image.NEAREST).save(png)
    cfg = Config.fromfile(osp.join(REPO_ROOT, DEMO_CONFIG))
    for pipeline in (cfg.train_pipeline, cfg.test_pipeline):
        ds = _dataset(root, pipeline, type='CheckedSegDataset', metainfo=dict(classes=DEMO_CLASSES),
                      reduce_zero_label=True)
        with pytest.raises(ValueError, match=r'label map .*demo_t0000\.png is \d+x\d+ .*but its image '
                                             r'.*demo_t0000\.jpg is \d+x\d+'):
            ds[0]
        ds[1]  # the others load
    # an RGB label map is refused too
    Image.open(png).convert('RGB').save(png)
    ds = _dataset(root, cfg.test_pipeline, type='CheckedSegDataset', metainfo=dict(classes=DEMO_CLASSES),
                  reduce_zero_label=True)
    with pytest.raises(ValueError, match='single-channel'):
        ds[0]


def test_empty_or_missing_split_is_a_clear_error(demo_ade, tmp_path):
    root = str(tmp_path / 'ade')
    os.makedirs(osp.join(root, 'images', 'training'))
    os.makedirs(osp.join(root, 'annotations', 'training'))
    with pytest.raises(ValueError,
                       match=r"split is empty: no images ending in '\.jpg' under .*images/training"):
        _dataset(root, [])
    with pytest.raises(FileNotFoundError, match=r'image folder .*images/validation.* does not exist'):
        _dataset(root, [], split='validation')
    # images without label maps
    data = _copy_demo(demo_ade, tmp_path / 'data')
    os.remove(osp.join(data, 'annotations', 'training', 'demo_t0002.png'))
    with pytest.raises(FileNotFoundError, match=r'1 of 6 images have no label map .*demo_t0002\.png'):
        _dataset(data, [])
