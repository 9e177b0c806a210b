"""Helpers shared by the segmentation tests: segmentor building in the mmseg scope
(SyncBN as BN, tiny arch and heads), raw data batches, the configs under test."""
import copy
import os.path as osp

import pytest
import torch

from conftest import REPO_ROOT

SEG_DIR = osp.join(REPO_ROOT, 'configs', 'segmentation')
DEMO_CONFIG = 'configs/segmentation/polapp-b1_lightham_1xb8-1k_demo-ade20k-64x64.py'
TINY_ARCH = dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 3, 4])
DEMO_CLASSES = ('sky', 'grass', 'disk', 'box', 'triangle')


@pytest.fixture(autouse=True, scope='module')
def single_thread():
    """These tests run tiny models: one intra-op thread is faster, above all on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def init_mmseg():
    from mmengine.registry import init_default_scope

    import polaformerpp  # noqa: F401
    import polaformerpp.datasets.seg_checks  # noqa: F401
    init_default_scope('mmseg')


def sync_bn_to_bn(node):
    if isinstance(node, dict):
        if node.get('type') == 'SyncBN':
            node['type'] = 'BN'
        for value in node.values():
            sync_bn_to_bn(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            sync_bn_to_bn(value)


def build_segmentor(model_cfg, crop=(64, 64), tiny=False, **backbone):
    """The config's segmentor without its checkpoint, SyncBN as BN, training crops of ``crop``."""
    init_mmseg()
    from mmseg.registry import MODELS
    model_cfg = copy.deepcopy(model_cfg)
    model_cfg.backbone.init_cfg = None
    model_cfg.data_preprocessor.size = crop
    if tiny:
        model_cfg.backbone.arch = copy.deepcopy(TINY_ARCH)
        model_cfg.backbone.drop_path_rate = 0.0
        shrink_heads(model_cfg, TINY_ARCH['embed_dims'])
    model_cfg.backbone.update(backbone)
    sync_bn_to_bn(model_cfg)
    model = MODELS.build(model_cfg)
    model.init_weights()
    return model


def shrink_heads(model_cfg, dims, channels=64):
    """Heads matching backbone channels ``dims`` with ``channels`` inner channels."""
    out = model_cfg.backbone.out_indices
    for key in ('decode_head', 'auxiliary_head'):
        head = model_cfg.get(key)
        if head is None:
            continue
        idx = head.in_index
        head.in_channels = ([dims[out[i]] for i in idx] if isinstance(idx, (list, tuple))
                            else dims[out[idx]])
        head.channels = channels
        if 'ham_channels' in head:
            head.ham_channels = channels


def seg_batch(sizes, num_classes, seed=0):
    """Raw (uint8 image, gt) data as the dataloader gives it, for ``model.data_preprocessor``."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    g = torch.Generator().manual_seed(seed)
    inputs, samples = [], []
    for h, w in sizes:
        inputs.append(torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8))
        label = torch.randint(0, num_classes, (1, h, w), generator=g)
        label[:, :2] = 255  # some ignored pixels
        sample = SegDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w)))
        sample.gt_sem_seg = PixelData(data=label)
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)
