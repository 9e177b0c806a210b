"""Safe loading: a pickle that would run code when unpickled is refused by every tool that takes a
checkpoint, with the file named, and its payload (creating a marker file) never runs."""
import json
import os
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import REPO_ROOT, load_tool
from polaformerpp.utils import UnsafeCheckpointError, load_checkpoint_file

DEMO_CONFIG = osp.join(REPO_ROOT, 'configs', 'classification', 'polapp-b0_1xb32-30e_demo-shapes.py')
PIXEL_CONFIG = osp.join(REPO_ROOT, 'configs', 'generation', 'dit-tiny-4_polapp_1xb32-2k_demo-shapes-32.py')
SR_CONFIG = osp.join(REPO_ROOT, 'configs', 'super_resolution', 'polapp-srlight_x2_8xb16-500k_div2k-192.py')
TINY_ARCH = dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 4], cls_proj_channels=64)
TINY_DIT = ['model.dit.arch.hidden_size=32', 'model.dit.arch.depth=1', 'model.dit.arch.num_heads=2']


class Payload:
    """Unpickled in full, this creates ``path`` (``open(path, 'w')``): the stand-in for a shell command."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (self.path, 'w')


@pytest.fixture(scope='module')
def evil(tmp_path_factory):
    """``(config, evil.pth, marker)``: a tiny classifier config and a checkpoint with a payload."""
    root = tmp_path_factory.mktemp('evil')
    config = root / 'polapp-tiny_demo.py'
    config.write_text(f"_base_ = [{DEMO_CONFIG!r}]\n"
                      f"model = dict(backbone=dict(arch=dict(_delete_=True, **{TINY_ARCH!r})),\n"
                      f"             head=dict(in_channels={TINY_ARCH['cls_proj_channels']}))\n")
    marker = root / 'PAYLOAD_RAN'
    ckpt = root / 'evil.pth'
    torch.save({'state_dict': {'backbone.w': torch.zeros(2)}, 'meta': {'hook': Payload(str(marker))}}, ckpt)
    return str(config), str(ckpt), str(marker)


def assert_refused(proc_or_error, ckpt, marker):
    text = proc_or_error if isinstance(proc_or_error, str) else proc_or_error.stdout + proc_or_error.stderr
    assert f'refusing to load checkpoint {ckpt}' in text, text[-3000:]
    assert 'it wants io.open' in text and '--unsafe-load' in text, text[-3000:]
    assert not osp.exists(marker), 'the payload ran'


def run_failing(args, **kwargs):
    env = dict(os.environ, OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=600, **kwargs)
    assert proc.returncode != 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def data_options(root):
    options = []
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        options += [f'{key}.dataset.data_root={root}', f'{key}.num_workers=0']
    return options


# ----------------------------------------------------------------------------- the allow-list
def test_runner_checkpoint_types_load_with_weights_only(tmp_path):
    """What a Runner checkpoint holds besides tensors (message hub, numpy state) loads with bare torch.load."""
    from mmengine.logging import HistoryBuffer, MessageHub
    hub = MessageHub('safe-loading-test')
    for value in (1.5, 2.5):
        hub.update_scalar('train/loss', value)
    hub.update_info('best', np.float64(0.75))
    ckpt = {'state_dict': {'w': torch.ones(3)}, 'message_hub': hub.state_dict(),
            'meta': {'arr': np.arange(4, dtype=np.int64), 'f32': np.float32(1.0), 'seed': 3}}
    torch.save(ckpt, tmp_path / 'runner.pth')
    loaded = torch.load(tmp_path / 'runner.pth')  # weights_only=True by default
    buffer = loaded['message_hub']['log_scalars']['train/loss']
    assert isinstance(buffer, HistoryBuffer) and buffer.mean() == 2.0 and buffer.current() == 2.5
    assert loaded['meta']['arr'].tolist() == [0, 1, 2, 3] and loaded['meta']['f32'] == 1.0


class GetattrGadget:
    def __reduce__(self):
        from mmengine.logging import HistoryBuffer
        return getattr, (HistoryBuffer, '__init__')


def test_restricted_getattr_and_unsafe_opt_in(tmp_path, evil):
    torch.save({'x': GetattrGadget()}, tmp_path / 'gadget.pth')
    with pytest.raises(UnsafeCheckpointError, match='gadget.pth'):
        load_checkpoint_file(tmp_path / 'gadget.pth')
    _, ckpt, marker = evil
    with pytest.raises(UnsafeCheckpointError) as info:
        load_checkpoint_file(ckpt)
    assert_refused(str(info.value), ckpt, marker)
    # a file the user trusts, with a type outside the allow-list: refused, then loaded with the opt-in
    import datetime
    torch.save({'state_dict': {}, 'meta': {'when': datetime.date(2024, 1, 2)}}, tmp_path / 'trusted.pth')
    with pytest.raises(UnsafeCheckpointError, match=r'trusted\.pth: it wants datetime\.date'):
        load_checkpoint_file(tmp_path / 'trusted.pth')
    assert load_checkpoint_file(tmp_path / 'trusted.pth', unsafe=True)['meta']['when'].year == 2024


def test_every_tool_documents_unsafe_load(capsys):
    for tool in ('tools/train.py', 'tools/test.py', 'tools/generation/sample.py', 'tools/model_zoo/check_results.py',
                 'demo/image_demo.py', 'tools/analysis_tools/benchmark.py', 'tools/analysis_tools/attention_entropy.py',
                 'tools/analysis_tools/vis_temperatures.py', 'tools/analysis_tools/vis_polarity_mixing.py',
                 'tools/analysis_tools/vis_attention_maps.py'):
        with pytest.raises(SystemExit):
            load_tool(tool).parse_args(['--help'])
        out = ' '.join(capsys.readouterr().out.split())
        assert '--unsafe-load' in out and 'arbitrary code' in out, tool
        if tool not in ('tools/train.py', ):
            assert '--allow-partial' in out, tool


# ----------------------------------------------------------------------------- in-process tools and APIs
def test_analysis_tools_sample_demo_and_apis_refuse(evil, tmp_path, demo_in1k):
    config, ckpt, marker = evil
    out = str(tmp_path / 'out')
    for tool in ('attention_entropy', 'vis_temperatures', 'vis_polarity_mixing', 'vis_attention_maps'):
        with pytest.raises(UnsafeCheckpointError) as info:
            load_tool(f'tools/analysis_tools/{tool}.py').main([config, ckpt, '--out-dir', out])
        assert_refused(str(info.value), ckpt, marker)
    with pytest.raises(UnsafeCheckpointError) as info:
        load_tool('tools/analysis_tools/benchmark.py').main([config, '--checkpoint', ckpt, '--shape', '32',
                                                              '--device', 'cpu', '--warmup', '0', '--repeat', '1'])
    assert_refused(str(info.value), ckpt, marker)
    with pytest.raises(UnsafeCheckpointError) as info:
        load_tool('tools/generation/sample.py').main([PIXEL_CONFIG, ckpt, '--out-dir', out, '--num-samples', '1',
                                                       '--cfg-options', *TINY_DIT])
    assert_refused(str(info.value), ckpt, marker)
    image = osp.join(demo_in1k, 'val', sorted(os.listdir(osp.join(demo_in1k, 'val')))[0])
    with pytest.raises(UnsafeCheckpointError) as info:
        load_tool('demo/image_demo.py').main([image, config, '--weights', ckpt, '--out-dir', out, '--device', 'cpu'])
    assert_refused(str(info.value), ckpt, marker)

    from polaformerpp.apis import init_generator, init_restorer
    with pytest.raises(UnsafeCheckpointError) as info:
        init_restorer(SR_CONFIG, ckpt)
    assert_refused(str(info.value), ckpt, marker)
    with pytest.raises(UnsafeCheckpointError) as info:
        init_generator(PIXEL_CONFIG, ckpt, cfg_options=dict(o.split('=') for o in TINY_DIT))
    assert_refused(str(info.value), ckpt, marker)


# ----------------------------------------------------------------------------- the CLIs, as a user runs them
@pytest.mark.slow
@pytest.mark.parametrize('how', ['test', 'resume', 'load_from', 'init_cfg'])
def test_train_and_test_refuse(evil, demo_in1k, tmp_path, how):
    config, ckpt, marker = evil
    work = ['--work-dir', str(tmp_path / 'work')]
    if how == 'test':
        args = ['tools/test.py', config, ckpt, *work, '--cfg-options', *data_options(demo_in1k)]
    else:
        extra = {'resume': ['--resume', ckpt], 'load_from': ['--cfg-options', f'load_from={ckpt}'],
                 'init_cfg': ['--cfg-options', 'model.backbone.init_cfg.type=Pretrained',
                              f'model.backbone.init_cfg.checkpoint={ckpt}']}[how]
        options = ['--cfg-options', *data_options(demo_in1k), 'train_cfg.max_epochs=1']
        if extra[0] == '--cfg-options':
            options += extra[1:]
            extra = []
        args = ['tools/train.py', config, *work, *extra, *options]
    assert_refused(run_failing(args), ckpt, marker)


@pytest.mark.slow
def test_check_results_and_cli_exit(evil, demo_in1k, tmp_path):
    config, ckpt, marker = evil
    run_list = tmp_path / 'runs.json'
    run_list.write_text(json.dumps([dict(name='evil', config=config, checkpoint=ckpt,
                                         cfg_options=data_options(demo_in1k),
                                         results=[dict(Dataset='demo', Metrics={'Top 1 Accuracy': 25.0})])]))
    proc = run_failing(['tools/model_zoo/check_results.py', '--list', str(run_list), '--work-dir',
                        str(tmp_path / 'zoo')])
    assert 'refused: refusing to load checkpoint' in proc.stdout and ckpt in proc.stdout, proc.stdout
    assert not osp.exists(marker)
    proc = run_failing(['tools/analysis_tools/vis_temperatures.py', config, ckpt, '--out-dir', str(tmp_path)])
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr
    assert_refused(proc, ckpt, marker)
