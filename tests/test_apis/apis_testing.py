"""Helpers shared by the inference-API tests: a real photograph, the configs with
a tiny backbone (so every config runs on a small CPU), checkpoints as mmengine saves them."""
import copy
import glob
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.config import Config

from conftest import REPO_ROOT

TINY_ARCH = dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 4])
#: the test photograph's size, not square, so that a swapped H/W shows
IMG_H, IMG_W = 96, 128


def configs_of(task):
    """The configs of ``configs/<task>/`` (top level, not ``_base_``), relative to the repo root."""
    paths = sorted(glob.glob(osp.join(REPO_ROOT, 'configs', task, '*.py')))
    return [osp.relpath(p, REPO_ROOT) for p in paths]


def config_id(path):
    return osp.splitext(osp.basename(path))[0]


def load(path):
    return Config.fromfile(osp.join(REPO_ROOT, path))


def astronaut_bgr():
    """scikit-image's astronaut photograph (RGB) as OpenMMLab APIs take an array: BGR
    (``[..., ::-1]``, the ``mmcv.imread`` order), downscaled to ``IMG_H x IMG_W``."""
    import mmcv
    from skimage import data
    bgr = np.ascontiguousarray(data.astronaut()[..., ::-1])
    return mmcv.imresize(bgr, (IMG_W, IMG_H), interpolation='area')


def tiny_backbone(cfg, heads=('decode_head', 'auxiliary_head'), head_channels=32):
    """Replace ``cfg.model.backbone.arch`` by ``TINY_ARCH`` and shrink what reads its outputs:
    the neck's ``in_channels`` (mmdet) or the heads' (mmseg), in place; returns ``cfg``."""
    model = cfg.model
    model.backbone.arch = copy.deepcopy(TINY_ARCH)
    model.backbone.drop_path_rate = 0.0
    dims = TINY_ARCH['embed_dims']
    out = model.backbone.out_indices
    if 'neck' in model and 'in_channels' in model.neck and isinstance(model.neck.in_channels, list):
        model.neck.in_channels = [dims[i] for i in out]
    for key in heads:
        head = model.get(key)
        if head is None or 'in_index' not in head:
            continue
        idx = head.in_index
        head.in_channels = [dims[out[i]] for i in idx] if isinstance(idx, (list, tuple)) else dims[out[idx]]
        head.channels = head_channels
        if 'ham_channels' in head:
            head.ham_channels = head_channels
        if head.get('norm_cfg', {}).get('type') == 'GN':
            head.norm_cfg.num_groups = 8
    return cfg


def save_weights(model, path, dataset_meta=None):
    """A checkpoint as ``tools/train.py`` leaves it for inference: ``meta`` + ``state_dict``."""
    meta = {} if dataset_meta is None else dict(dataset_meta=dataset_meta)
    torch.save(dict(meta=meta, state_dict=model.state_dict()), path)
    return str(path)


def perturb(model, seed=0, scale=0.05):
    """Random non-zero weights (so a loaded checkpoint differs from a fresh build)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models on a small shared CPU: one intra-op thread is faster."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
