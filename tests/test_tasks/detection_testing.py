"""Helpers shared by the detection tests: config loading with overrides, detector
building in the mmdet scope, mmdet's demo inputs, the generated COCO-format set."""
import copy
import json
import os
import os.path as osp
import shutil

import pytest
import torch
from mmengine.config import Config

from conftest import REPO_ROOT, load_tool

MASK_RCNN_B2 = 'configs/detection/mask-rcnn_polapp-b2_fpn_8xb2-amp-1x_coco.py'
RETINANET_B2 = 'configs/detection/retinanet_polapp-b2_fpn_8xb2-amp-1x_coco.py'
CLS_DEMO_CONFIG = 'configs/classification/polapp-b0_1xb32-30e_demo-shapes.py'


# a small arch for CPU runs (softmax stages need head dims divisible by 4)
TINY = dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 4])
CLASSES = ('disk', 'square', 'triangle')


def use_mmdet():
    """Register the project's modules and make mmdet the default scope."""
    from mmengine.registry import init_default_scope

    import polaformerpp  # noqa: F401
    import polaformerpp.datasets.coco_checks  # noqa: F401
    init_default_scope('mmdet')


def load_cfg(path, **options):
    """The config at ``path`` with ``options`` (``'a.b.c': value``) set, replacing what was there."""
    cfg = Config.fromfile(path if osp.isabs(path) else osp.join(REPO_ROOT, path))
    for key, value in options.items():
        *parents, leaf = key.split('.')
        node = cfg
        for name in parents:
            node = node[name]
        node[leaf] = copy.deepcopy(value)
    return cfg


def build_detector(cfg):
    use_mmdet()
    from mmdet.registry import MODELS
    return MODELS.build(cfg.model)


def demo_batch(model, shapes=((3, 97, 131), (3, 120, 100)), num_classes=80, with_mask=True,
               training=True):
    """mmdet's packed demo inputs (random boxes and masks) through the model's preprocessor."""
    from mmdet.testing import demo_mm_inputs
    torch.manual_seed(0)
    packed = demo_mm_inputs(batch_size=len(shapes), image_shapes=list(shapes), num_items=[3, 2],
                            num_classes=num_classes, with_mask=with_mask)
    return model.data_preprocessor(packed, training)


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a small shared CPU, OpenMP threads competing with other
    processes slow these small forwards down by an order of magnitude."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope='module')
def demo_coco(tmp_path_factory):
    """The generated COCO-format shapes set: 32 train / 12 val JPEGs, 3 categories."""
    make = load_tool('tools/misc/make_demo_coco.py').make_demo_coco
    root = str(tmp_path_factory.mktemp('demo_coco'))
    make(root, num_train=32, num_val=12, num_classes=len(CLASSES), seed=0)
    return root


def broken_copy(demo_coco, tmp_path, edit):
    """A copy of the demo set's train split whose json has been changed by ``edit``."""
    root = str(tmp_path / 'broken')
    shutil.copytree(osp.join(demo_coco, 'train'), osp.join(root, 'train'))
    os.makedirs(osp.join(root, 'annotations'))
    with open(osp.join(demo_coco, 'annotations', 'instances_train.json')) as f:
        coco = json.load(f)
    edit(coco)
    with open(osp.join(root, 'annotations', 'instances_train.json'), 'w') as f:
        json.dump(coco, f)
    return root


def set_category(coco):
    coco['annotations'][3]['category_id'] = 42
