"""``tools/train.py --tensorboard``: mmengine's TensorboardVisBackend beside each task's own backends.

The visualizers are built by the libraries' own registries (mmpretrain's
UniversalVisualizer, mmdet's DetLocalVisualizer, mmseg's SegLocalVisualizer,
mmengine's Visualizer for super-resolution and DiT), and the events file a
short demo run writes is read back with TensorBoard's own reader.
"""
import argparse
import glob
import importlib.util
import os.path as osp

import pytest
from mmengine.config import Config, DictAction
from mmengine.registry import VISUALIZERS, DefaultScope

from conftest import REPO_ROOT, call_tool, load_tool
from polaformerpp.utils.runtime import add_tensorboard_backend

DEMO_CONFIG = 'configs/classification/polapp-b0_1xb32-30e_demo-shapes.py'
TASK_CONFIGS = {
    'classification': (DEMO_CONFIG, 'UniversalVisualizer'),
    'detection': ('configs/detection/retinanet_polapp-b2_fpn_8xb2-amp-1x_coco.py', 'DetLocalVisualizer'),
    'segmentation': ('configs/segmentation/polapp-b1_lightham_1xb8-1k_demo-ade20k-64x64.py', 'SegLocalVisualizer'),
    'super_resolution': ('configs/super_resolution/polapp-srlight_x2_8xb16-500k_div2k-192.py', 'Visualizer'),
    'generation': ('configs/generation/dit-tiny-4_polapp_1xb32-2k_demo-shapes-32.py', 'Visualizer'),
}


@pytest.fixture(scope='module')
def train_tool():
    return load_tool('tools/train.py')


def backend_types(cfg):
    return [b['type'] for b in cfg.visualizer.vis_backends]


@pytest.mark.parametrize('task', sorted(TASK_CONFIGS))
def test_tensorboard_flag_on_every_task_config(task, train_tool, tmp_path):
    config, visualizer_type = TASK_CONFIGS[task]
    args = train_tool.parse_args([osp.join(REPO_ROOT, config), '--tensorboard', '--work-dir', str(tmp_path)])
    cfg = train_tool.merge_args(Config.fromfile(args.config), args)
    assert cfg.visualizer.type == visualizer_type
    assert backend_types(cfg) == ['LocalVisBackend', 'TensorboardVisBackend']

    # what the Runner does with it: the task library's registry builds the visualizer
    vis_cfg = dict(cfg.visualizer, name=f'tb_check_{task}', save_dir=str(tmp_path / 'vis_data'))
    scope = cfg.get('default_scope') or 'mmengine'
    with DefaultScope.overwrite_default_scope(scope):
        visualizer = VISUALIZERS.build(vis_cfg)
    assert type(visualizer).__name__ == visualizer_type
    assert [type(b).__name__ for b in visualizer._vis_backends.values()] == \
        ['LocalVisBackend', 'TensorboardVisBackend']


def test_without_the_flag_the_backends_are_unchanged(train_tool):
    args = train_tool.parse_args([osp.join(REPO_ROOT, DEMO_CONFIG)])
    assert args.tensorboard is False
    cfg = train_tool.merge_args(Config.fromfile(args.config), args)
    assert backend_types(cfg) == ['LocalVisBackend']


def test_add_tensorboard_backend_is_idempotent_and_keeps_others():
    cfg = Config(dict(visualizer=dict(type='Visualizer', vis_backends=[dict(type='LocalVisBackend'),
                                                                      dict(type='WandbVisBackend')])))
    add_tensorboard_backend(cfg)
    add_tensorboard_backend(cfg)
    assert backend_types(cfg) == ['LocalVisBackend', 'WandbVisBackend', 'TensorboardVisBackend']

    cfg = Config(dict(visualizer=dict(type='Visualizer', vis_backends=None)))
    add_tensorboard_backend(cfg)
    assert backend_types(cfg) == ['TensorboardVisBackend']


@pytest.mark.parametrize('cfg_dict', [dict(), dict(visualizer=None), dict(visualizer=dict(vis_backends='local'))])
def test_add_tensorboard_backend_clear_errors(cfg_dict):
    with pytest.raises(ValueError, match='--tensorboard'):
        add_tensorboard_backend(Config(cfg_dict))


def test_cfg_options_form_replaces_the_first_backend():
    """The nearest ``--cfg-options`` form: DictAction parses no dicts, so it swaps a backend's type."""
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    options = parser.parse_args(['--cfg-options', 'visualizer.vis_backends.0.type=TensorboardVisBackend'])
    cfg = Config.fromfile(osp.join(REPO_ROOT, DEMO_CONFIG))
    cfg.merge_from_dict(options.cfg_options)
    assert backend_types(cfg) == ['TensorboardVisBackend']


def test_help_documents_the_flag(train_tool, capsys):
    with pytest.raises(SystemExit):
        train_tool.parse_args(['--help'])
    out = capsys.readouterr().out
    assert '--tensorboard' in out and 'TensorboardVisBackend' in out


def test_missing_tensorboard_package_is_named(train_tool, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None if name == 'tensorboard'
                        else find_spec(name, *a))
    args = train_tool.parse_args([osp.join(REPO_ROOT, DEMO_CONFIG), '--tensorboard'])
    with pytest.raises(ImportError, match='pip install tensorboard'):
        train_tool.merge_args(Config.fromfile(args.config), args)


@pytest.mark.slow
def test_demo_run_writes_tensorboard_events(demo_in1k, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    work_dir = str(tmp_path / 'tb_work')
    options = []
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        options += [f'{key}.dataset.data_root={demo_in1k}', f'{key}.num_workers=0']
    options += ['train_dataloader.dataset.pipeline.1.scale=32', 'val_dataloader.dataset.pipeline.1.scale=32',
                'val_dataloader.dataset.pipeline.2.crop_size=32',
                'model.backbone.arch._delete_=True', 'model.backbone.arch.embed_dims=[16,32,48,64]',
                'model.backbone.arch.depths=[1,1,1,1]', 'model.backbone.arch.num_heads=[1,2,2,4]',
                'model.backbone.arch.cls_proj_channels=64', 'model.head.in_channels=64',
                'train_cfg.max_epochs=1', 'train_cfg.val_interval=1', 'default_hooks.logger.interval=1']
    call_tool(['tools/train.py', DEMO_CONFIG, '--tensorboard', '--work-dir', work_dir, '--cfg-options', *options],
              env=dict(OMP_NUM_THREADS='1'))
    events = glob.glob(osp.join(work_dir, '*', 'vis_data', 'events.out.tfevents.*'))
    assert len(events) == 1, glob.glob(osp.join(work_dir, '**'), recursive=True)
    # the local backend is kept beside it
    assert glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))

    accumulator = EventAccumulator(osp.dirname(events[0]))
    accumulator.Reload()
    tags = accumulator.Tags()['scalars']
    assert 'loss' in tags and 'lr' in tags and 'accuracy/top1' in tags, tags
    assert len(accumulator.Scalars('loss')) >= 2
