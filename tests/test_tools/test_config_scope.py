"""The ``polaformerpp::`` config scope: configs written outside the repository inherit ours.

Fast: ``Config.fromfile`` of scoped configs in a temporary folder (overrides merge,
nested relative and ``mmdet::``/``mmseg::`` bases resolve, scope tags follow the
base's ``default_scope``), unknown configs fail clearly, mmengine's hub reads
our model index. Slow: one training iteration per task through ``tools/train.py``
run from that folder (and through mmpretrain's own train tool behind a
three-line wrapper), and the configs shipped by an sdist -> wheel build.
"""
import os
import os.path as osp
import subprocess
import sys
import tarfile

import pytest
from mmengine.config import Config

import polaformerpp  # noqa: F401  (registers the scope)
from conftest import REPO_ROOT, load_tool, run_tool
from polaformerpp.utils import installed_config_dir, is_config_scope_registered, register_config_scope

CLS_CONFIG = 'classification/polapp-b0_8xb256_in1k.py'
DET_CONFIG = 'detection/mask-rcnn_polapp-b2_fpn_8xb2-amp-1x_coco.py'
SEG_CONFIG = 'segmentation/polapp-b1_lightham_8xb8-160k_ade20k-512x512.py'
TRAIN = osp.join(REPO_ROOT, 'tools', 'train.py')
TINY = dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 4])
TINY_SRC = 'dict(_delete_=True, ' + ', '.join(f'{k}={v!r}' for k, v in TINY.items()) + ')'
ONE_THREAD = dict(OMP_NUM_THREADS='1')
# what a downstream project's tools/train.py can be: a library's own train tool, scope registered first
WRAPPER = """import os.path as osp
import runpy

import {library}

import polaformerpp  # noqa: F401  (registers polaformerpp:: before the config is read)

runpy.run_path(osp.join(osp.dirname({library}.__file__), '.mim', 'tools', 'train.py'), run_name='__main__')
"""


def write(folder, name, text):
    path = osp.join(str(folder), name)
    with open(path, 'w') as f:
        f.write(text)
    return path


# ---------------------------------------------------------------- fast


def test_import_registers_the_scope_and_ships_the_configs():
    from mmengine.config.utils import MODULE2PACKAGE
    assert 'polaformerpp' in MODULE2PACKAGE
    assert is_config_scope_registered()
    register_config_scope()  # idempotent: still one wrapper
    assert is_config_scope_registered()
    root = installed_config_dir()
    for name in (CLS_CONFIG, DET_CONFIG, SEG_CONFIG):
        assert osp.isfile(osp.join(root, name)), name
    assert osp.isfile(osp.join(root, '..', 'model-index.yml'))
    # the editable install of a checkout serves the checkout's configs (a link, not a stale copy)
    assert osp.samefile(osp.join(root, CLS_CONFIG), osp.join(REPO_ROOT, 'configs', CLS_CONFIG))


def test_scoped_classification_config_merges_overrides(tmp_path):
    path = write(tmp_path, 'my_cls.py', f"""_base_ = ['polaformerpp::{CLS_CONFIG}']
model = dict(head=dict(num_classes=7))
optim_wrapper = dict(optimizer=dict(lr=0.1))
""")
    cfg = Config.fromfile(path)
    ours = Config.fromfile(osp.join(REPO_ROOT, 'configs', CLS_CONFIG))
    # values from our config (and its relative ./_base_ files) are there
    assert cfg.model.backbone.type == 'PolaFormerPP' and cfg.model.backbone.arch == 'b0'
    assert cfg.model.head.in_channels == ours.model.head.in_channels == 2048
    assert cfg.optim_wrapper.optimizer.weight_decay == 0.05
    assert cfg.train_cfg.max_epochs == 300
    assert cfg.default_scope == 'mmpretrain'
    # the overrides win
    assert cfg.model.head.num_classes == 7 and ours.model.head.num_classes == 1000
    assert cfg.optim_wrapper.optimizer.lr == 0.1
    # typed dicts are tagged with the scope our config is written for, not 'polaformerpp'
    assert cfg.model.get('_scope_') == 'mmpretrain'
    assert cfg.train_dataloader.dataset.get('_scope_') == 'mmpretrain'


def test_scoped_detection_and_segmentation_configs_resolve_nested_bases(tmp_path):
    det = Config.fromfile(write(tmp_path, 'my_det.py', f"""_base_ = ['polaformerpp::{DET_CONFIG}']
model = dict(roi_head=dict(bbox_head=dict(num_classes=3)))
"""))
    assert det.default_scope == 'mmdet'
    assert det.model.type == 'MaskRCNN' and det.model.get('_scope_') == 'mmdet'
    assert det.model.backbone.type == 'PolaFormerPP' and det.model.backbone.arch == 'b2'
    assert det.model.rpn_head.type == 'RPNHead'  # from mmdet::_base_/models/mask-rcnn_r50_fpn.py
    assert det.model.neck.in_channels == [64, 128, 256, 512]  # ours
    assert det.model.roi_head.bbox_head.num_classes == 3  # the override
    assert det.model.roi_head.mask_head.num_classes == 80  # mmdet's
    assert det.train_dataloader.dataset.type == 'CheckedCocoDataset'  # ./_base_/coco_instance.py

    seg = Config.fromfile(write(tmp_path, 'my_seg.py', f"""_base_ = ['polaformerpp::{SEG_CONFIG}']
train_dataloader = dict(batch_size=4)
"""))
    assert seg.default_scope == 'mmseg'
    assert seg.model.backbone.arch == 'b1' and seg.model.decode_head.num_classes == 150
    assert seg.train_dataloader.batch_size == 4
    assert seg.train_dataloader.dataset.type == 'CheckedADE20KDataset'
    assert seg.train_dataloader.dataset.get('_scope_') == 'mmseg'
    assert seg.crop_size == (512, 512)  # from mmseg::_base_/datasets/ade20k.py


def test_scoped_base_fragment_takes_the_inheriting_configs_scope(tmp_path):
    text = "_base_ = ['polaformerpp::_base_/models/polapp_classifier.py']\ndefault_scope = 'mmpretrain'\n"
    cfg = Config.fromfile(write(tmp_path, 'my_fragment.py', text))
    assert cfg.model.backbone.type == 'PolaFormerPP'
    assert cfg.model.get('_scope_') is None  # resolved under the final default_scope


def test_unknown_scoped_configs_fail_clearly(tmp_path):
    missing = write(tmp_path, 'missing.py', "_base_ = ['polaformerpp::classification/nope.py']\n")
    with pytest.raises(FileNotFoundError, match=r'\.mim/configs/classification/nope\.py'):
        Config.fromfile(missing)
    no_folder = write(tmp_path, 'no_folder.py', "_base_ = ['polaformerpp::nope.py']\n")
    with pytest.raises(ValueError, match='relative config path'):
        Config.fromfile(no_folder)


def test_mmengine_hub_reads_our_model_index():
    from mmengine.hub import get_config
    cfg = get_config(f'polaformerpp::{CLS_CONFIG}')
    assert cfg.model.backbone.arch == 'b0' and cfg.model.head.num_classes == 1000


# ---------------------------------------------------------------- slow: train from a foreign folder


@pytest.mark.slow
def test_train_a_scoped_classification_config_from_another_folder(demo_in1k, tmp_path):
    config = write(tmp_path, 'cls_tiny.py', f"""_base_ = ['polaformerpp::{CLS_CONFIG}']
model = dict(backbone=dict(arch={TINY_SRC}, drop_path_rate=0.0))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=32, backend='pillow'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=32, edge='short', backend='pillow'),
    dict(type='CenterCrop', crop_size=32),
    dict(type='PackInputs'),
]
train_dataloader = dict(batch_size=8, num_workers=0, persistent_workers=False, pin_memory=False,
                        dataset=dict(data_root={demo_in1k!r}, indices=8, pipeline=train_pipeline))
val_dataloader = dict(batch_size=8, num_workers=0, persistent_workers=False, pin_memory=False,
                      dataset=dict(data_root={demo_in1k!r}, indices=8, pipeline=test_pipeline))
train_cfg = dict(max_epochs=1, val_interval=1)
""")
    work_dir = tmp_path / 'work'
    run_tool([TRAIN, config, '--work-dir', str(work_dir)], cwd=str(tmp_path), env=ONE_THREAD)
    assert (work_dir / 'epoch_1.pth').is_file()

    # mmpretrain's own tools/train.py (shipped in its .mim) through a wrapper that imports
    # polaformerpp first: its config reading comes before any custom_imports
    wrapper = write(tmp_path, 'train_with_mmpretrain.py', WRAPPER.format(library='mmpretrain'))
    work_dir = tmp_path / 'work_mmpretrain'
    run_tool([wrapper, config, '--work-dir', str(work_dir)], cwd=str(tmp_path), env=ONE_THREAD)
    assert (work_dir / 'epoch_1.pth').is_file()


@pytest.mark.slow
def test_train_a_scoped_detection_config_from_another_folder(tmp_path):
    classes = ('disk', 'square', 'triangle')
    data_root = str(tmp_path / 'coco')
    load_tool('tools/misc/make_demo_coco.py').make_demo_coco(data_root, num_train=4, num_val=2,
                                                             num_classes=len(classes), seed=0)
    config = write(tmp_path, 'det_tiny.py', f"""_base_ = ['polaformerpp::{DET_CONFIG}']
model = dict(
    backbone=dict(arch={TINY_SRC}, drop_path_rate=0.0, init_cfg=None),
    neck=dict(in_channels={TINY['embed_dims']!r}, out_channels=32),
    rpn_head=dict(in_channels=32, feat_channels=32),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=32),
        bbox_head=dict(in_channels=32, fc_out_channels=64, num_classes={len(classes)}),
        mask_roi_extractor=dict(out_channels=32),
        mask_head=dict(num_convs=1, in_channels=32, conv_out_channels=32, num_classes={len(classes)})),
    train_cfg=dict(rpn_proposal=dict(nms_pre=200, max_per_img=100), rcnn=dict(sampler=dict(num=64))))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=(128, 96), keep_ratio=True),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root={data_root + '/'!r}, ann_file='annotations/instances_train.json',
                 data_prefix=dict(img='train/'), metainfo=dict(classes={classes!r}), indices=2,
                 pipeline=train_pipeline))
train_cfg = dict(max_epochs=1)
default_hooks = dict(checkpoint=dict(interval=1))
""")
    work_dir = tmp_path / 'work'
    run_tool([TRAIN, config, '--work-dir', str(work_dir), '--no-validate'], cwd=str(tmp_path),
             env=ONE_THREAD)
    assert (work_dir / 'epoch_1.pth').is_file()


@pytest.mark.slow
def test_train_a_scoped_segmentation_config_from_another_folder(tmp_path):
    data_root = str(tmp_path / 'ade')
    load_tool('tools/misc/make_demo_ade20k.py').make_demo_ade20k(data_root, num_train=2, num_val=1,
                                                                 min_size=64, max_size=80, seed=0)
    config = write(tmp_path, 'seg_tiny.py', f"""_base_ = ['polaformerpp::{SEG_CONFIG}']
crop_size = (64, 64)
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(arch={TINY_SRC}, drop_path_rate=0.0, init_cfg=None),
    decode_head=dict(in_channels={TINY['embed_dims'][1:]!r}, channels=32, ham_channels=32))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomCrop', crop_size=crop_size),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root={data_root!r}, pipeline=train_pipeline))
train_cfg = dict(max_iters=1)
default_hooks = dict(checkpoint=dict(interval=1))
""")
    work_dir = tmp_path / 'work'
    run_tool([TRAIN, config, '--work-dir', str(work_dir), '--no-validate'], cwd=str(tmp_path),
             env=ONE_THREAD)
    assert (work_dir / 'iter_1.pth').is_file()


# ---------------------------------------------------------------- slow: what a wheel ships


@pytest.mark.slow
def test_sdist_carries_the_configs_and_its_build_ships_them_in_mim(tmp_path):
    env = dict(os.environ, PYTHONWARNINGS='ignore')
    subprocess.run([sys.executable, 'setup.py', '-q', 'sdist', '-d', str(tmp_path / 'dist')], cwd=REPO_ROOT,
                   env=env, check=True, capture_output=True)
    (archive, ) = (tmp_path / 'dist').glob('polaformerpp-*.tar.gz')
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / 'src', filter='data')
    top = names[0].split('/')[0]
    assert f'{top}/configs/{CLS_CONFIG}' in names and f'{top}/model-index.yml' in names
    assert f'{top}/requirements/runtime.txt' in names
    assert not any('/.mim' in name for name in names)

    # building from the unpacked sdist: copies (not links) under build_lib, links in the tree
    src = tmp_path / 'src' / top
    build_lib = tmp_path / 'build_lib'
    subprocess.run([sys.executable, 'setup.py', '-q', 'build_py', '--build-lib', str(build_lib)], cwd=src,
                   env=env, check=True, capture_output=True)
    shipped = build_lib / 'polaformerpp' / '.mim'
    for name in (f'configs/{CLS_CONFIG}', f'configs/{DET_CONFIG}', 'configs/detection/_base_/coco_instance.py',
                 'model-index.yml'):
        assert (shipped / name).is_file() and not (shipped / name).is_symlink(), name
    assert not (shipped / 'configs').is_symlink()
    assert (src / 'polaformerpp' / '.mim' / 'configs').is_symlink()
    assert osp.samefile(src / 'polaformerpp' / '.mim' / 'configs' / CLS_CONFIG, src / 'configs' / CLS_CONFIG)
