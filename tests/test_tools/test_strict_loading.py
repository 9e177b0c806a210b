"""Strict loading: evaluation, analysis and inference refuse a checkpoint that does not fit the model
(listing what is missing, unexpected or mis-shaped); --allow-partial proceeds; fine-tuning through
load_from / init_cfg stays lenient and logs a one-line summary."""
import os.path as osp
import subprocess
import sys

import pytest
import torch
from torch import nn

from conftest import REPO_ROOT, call_tool
from polaformerpp.analysis import load_model
from polaformerpp.utils import CheckpointMismatchError, compare_state_dict, load_model_weights

DEMO_CONFIG = osp.join(REPO_ROOT, 'configs', 'classification', 'polapp-b0_1xb32-30e_demo-shapes.py')
TINY_ARCH = dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 4], cls_proj_channels=64)
OTHER_ARCH = dict(embed_dims=[16, 32, 48, 80], depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 4], cls_proj_channels=64)


def write_config(path, arch):
    path.write_text(f"_base_ = [{DEMO_CONFIG!r}]\n"
                    f"model = dict(backbone=dict(arch=dict(_delete_=True, **{arch!r})),\n"
                    f"             head=dict(in_channels={arch['cls_proj_channels']}))\n")
    return str(path)


@pytest.fixture(scope='module')
def checkpoints(tmp_path_factory):
    """The tiny config and checkpoints: ``good`` (fits), ``keys`` (head.fc.* dropped, one extra key),
    ``other`` (another arch: shape mismatches), ``empty`` (no weights at all)."""
    root = tmp_path_factory.mktemp('strict')
    config = write_config(root / 'tiny.py', TINY_ARCH)
    other_config = write_config(root / 'other.py', OTHER_ARCH)
    torch.manual_seed(0)
    state = load_model(config).state_dict()
    paths = dict(config=config)
    for name, ckpt in (('good', {'state_dict': state}),
                       ('keys', {'state_dict': {**{k: v for k, v in state.items() if not k.startswith('head.fc.')},
                                                'extra.weight': torch.zeros(1)}}),
                       ('other', {'state_dict': load_model(other_config).state_dict()}),
                       ('empty', {'meta': {'epoch': 1}})):
        paths[name] = str(root / f'{name}.pth')
        torch.save(ckpt, paths[name])
    return paths


def test_report_lists_first_few_and_counts():
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(8)])
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(('6.', '7.'))}
    state['0.weight'] = torch.zeros(3, 2)
    state.update({f'x{i}': torch.zeros(1) for i in range(7)})
    report = compare_state_dict(model, state, 'f.pth')
    assert (len(report.loaded), report.total) == (11, 16) and report.mismatched == [('0.weight', (3, 2), (2, 2))]
    message = report.error_message()
    assert 'checkpoint f.pth does not fit the model: 11/16 tensors' in message
    assert 'missing in the checkpoint (4): 6.weight, 6.bias, 7.weight, 7.bias' in message
    assert 'unexpected in the checkpoint (7): x0, x1, x2, x3, x4, ...' in message
    assert 'shape mismatch (1): 0.weight: checkpoint (3, 2) vs model (2, 2)' in message
    assert report.summary() == ('loaded 11/16 tensors from f.pth; missing: 6.weight, 6.bias, 7.weight, ... (4); '
                                'unexpected: x0, x1, x2, ... (7); shape mismatch: 0.weight (3, 2) vs (2, 2) (1)')


def test_apis_and_analysis_refuse_unless_allow_partial(checkpoints):
    config = checkpoints['config']
    assert load_model(config, checkpoints['good']) is not None
    for name, expected in (('keys', 'missing in the checkpoint (2): head.fc.weight, head.fc.bias'),
                           ('other', 'shape mismatch'), ('empty', 'unexpected in the checkpoint (1): meta')):
        with pytest.raises(CheckpointMismatchError) as info:
            load_model(config, checkpoints[name])
        assert expected in str(info.value) and checkpoints[name] in str(info.value)
    model = load_model(config)
    before = model.head.fc.weight.clone()
    report = load_model_weights(model, checkpoints['keys'], allow_partial=True)
    assert report.missing == ['head.fc.weight', 'head.fc.bias'] and report.unexpected == ['extra.weight']
    assert torch.equal(model.head.fc.weight, before)  # left as initialised

    from polaformerpp.apis.config_loading import build_from_config, load_config
    from polaformerpp.restoration import SRRestorer
    sr_config = osp.join(REPO_ROOT, 'configs', 'super_resolution', 'polapp-srlight_x2_8xb16-500k_div2k-192.py')
    with pytest.raises(CheckpointMismatchError, match='does not fit the model'):
        build_from_config(load_config(sr_config), SRRestorer, checkpoints['good'], 'cpu', 'init_restorer')


def test_init_cfg_pretrained_logs_a_summary(checkpoints, capsys):
    from mmengine.logging import MMLogger
    from mmengine.registry import MODELS
    MMLogger.get_instance('strict-loading-test')
    backbone = MODELS.build(dict(type='PolaFormerPP', arch=TINY_ARCH,
                                 init_cfg=dict(type='Pretrained', checkpoint=checkpoints['keys'], prefix='backbone.')))
    backbone.init_weights()
    out = capsys.readouterr()
    total = len(backbone.state_dict())
    assert f"loaded {total}/{total} tensors from {checkpoints['keys']}; missing: 0; unexpected: 0" in out.out + out.err


def run_test_tool(checkpoints, name, demo_in1k, tmp_path, *extra):
    options = []
    for key in ('test_dataloader', ):
        options += [f'{key}.dataset.data_root={demo_in1k}', f'{key}.num_workers=0',
                    f'{key}.dataset.pipeline.1.scale=32', f'{key}.dataset.pipeline.2.crop_size=32']
    cmd = [sys.executable, 'tools/test.py', checkpoints['config'], checkpoints[name], '--work-dir',
           str(tmp_path / name), *extra, '--cfg-options', *options]
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(__import__('os').environ, OMP_NUM_THREADS='1'))


@pytest.mark.slow
def test_test_tool_refuses_and_allow_partial_proceeds(checkpoints, demo_in1k, tmp_path):
    proc = run_test_tool(checkpoints, 'keys', demo_in1k, tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert f"checkpoint {checkpoints['keys']} does not fit the model" in proc.stderr
    assert 'missing in the checkpoint (2): head.fc.weight, head.fc.bias' in proc.stderr
    assert 'unexpected in the checkpoint (1): extra.weight' in proc.stderr
    assert 'Epoch(test)' not in proc.stdout + proc.stderr  # nothing was evaluated
    proc = run_test_tool(checkpoints, 'other', demo_in1k, tmp_path)
    assert proc.returncode == 1 and 'shape mismatch (' in proc.stderr, proc.stderr[-3000:]
    proc = run_test_tool(checkpoints, 'keys', demo_in1k, tmp_path, '--allow-partial')
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert '--allow-partial: loaded' in log and 'accuracy/top1' in log


@pytest.mark.slow
def test_load_from_fine_tuning_logs_a_summary(checkpoints, demo_in1k, tmp_path):
    options = []
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        options += [f'{key}.dataset.data_root={demo_in1k}', f'{key}.num_workers=0']
    options += ['train_dataloader.dataset.pipeline.1.scale=32', 'train_cfg.max_epochs=1', 'train_cfg.val_interval=10',
                f"load_from={checkpoints['keys']}", 'train_dataloader.batch_size=40',
                'train_dataloader.dataset.indices=40']
    proc = call_tool(['tools/train.py', checkpoints['config'], '--work-dir', str(tmp_path / 'ft'),
                      '--cfg-options', *options], env=dict(OMP_NUM_THREADS='1'))
    log = proc.stdout + proc.stderr
    total = len(load_model(checkpoints['config']).state_dict())
    assert (f"loaded {total - 2}/{total} tensors from {checkpoints['keys']}; missing: head.fc.weight, "
            f"head.fc.bias (2); unexpected: extra.weight (1); shape mismatch: 0") in log, log[-3000:]
