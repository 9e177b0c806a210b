"""benchmark.py --compare / --resolutions: PolaFormer++ dense backbones against mmpretrain's Swin and ConvNeXt."""
import csv
import os.path as osp

import pytest
import torch

from conftest import REPO_ROOT, load_tool
from polaformerpp.utils.cli import run_cli

TOOL = 'tools/analysis_tools/benchmark.py'
B0 = osp.join(REPO_ROOT, 'configs', 'classification', 'polapp-b0_8xb256_in1k.py')
RETINANET_B2 = osp.join(REPO_ROOT, 'configs', 'detection', 'retinanet_polapp-b2_fpn_8xb2-amp-1x_coco.py')
PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


@pytest.fixture(scope='module')
def tool():
    return load_tool(TOOL)


def test_compare_writes_table_csv_and_plot(tool, tmp_path, capsys):
    threads = torch.get_num_threads()
    try:
        rows = tool.main([B0, '--compare', 'swin-t', 'convnext-t', '--resolutions', '64', '96', '--device', 'cpu',
                          '--threads', '1', '--warmup', '0', '--repeat', '1', '--out-dir', str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    models = ['polapp-b0 L-L-S-S', 'polapp-b0 all-linear', 'swin-t', 'convnext-t']
    assert [(r['model'], r['resolution']) for r in rows] == [(m, s) for m in models for s in (64, 96)]
    assert all(r['status'] == 'ok' and r['latency_ms'] > 0 and r['peak_memory_mib'] > 0 for r in rows)
    params = {r['model']: r['params'] for r in rows}
    # the dense backbones: four stage outputs, no classification projection / head (7.55M with them);
    # linear attention adds its temperatures
    assert 3e6 < params['polapp-b0 L-L-S-S'] < params['polapp-b0 all-linear'] < 7_548_712
    assert 27e6 < params['swin-t'] < 28.5e6 and 27e6 < params['convnext-t'] < 28.5e6
    # memory grows with the input (activations of 96^2 > 64^2)
    memory = {(r['model'], r['resolution']): r['peak_memory_mib'] for r in rows}
    assert all(memory[(m, 96)] > memory[(m, 64)] for m in models)
    out = capsys.readouterr().out
    assert 'latency (ms)' in out and 'peak memory (MiB)' in out
    assert 'polapp-b0 all-linear vs swin-t' in out and 'polapp-b0 L-L-S-S vs convnext-t' in out
    with open(tmp_path / 'benchmark_compare.csv') as f:
        table = list(csv.DictReader(f))
    assert len(table) == 8 and table[0]['model'] == 'polapp-b0 L-L-S-S' and float(table[0]['latency_ms']) > 0
    with open(tmp_path / 'benchmark_compare.png', 'rb') as f:
        assert f.read(8) == PNG_MAGIC


def test_resolutions_alone_times_the_config_backbone_variants(tool, tmp_path):
    """A config whose backbone already is all-linear gives one variant; its dense outputs are 0-3."""
    all_linear = "model.backbone.attn_types=('linear','linear','linear','linear')"
    rows = tool.main([RETINANET_B2, '--resolutions', '64', '--warmup', '0', '--repeat', '1', '--device', 'cpu',
                      '--out-dir', '', '--cfg-options', all_linear, 'model.backbone.arch=b0'])
    assert [r['model'] for r in rows] == ['polapp-b0 L-L-L-L']
    assert rows[0]['status'] == 'ok'


@pytest.mark.parametrize('argv,name', [
    ([B0, '--compare', 'resnet50'], '--compare'),
    ([B0, '--compare', 'swin-t', '--shape', '64'], '--shape'),
    ([B0, '--resolutions', '0'], '--resolutions'),
    ([B0, '--resolutions', '64', '--checkpoint', B0], '--checkpoint'),
], ids=['unknown-peer', 'shape', 'resolution-0', 'checkpoint'])
def test_impossible_comparison_arguments_exit_2(tool, argv, name, capsys):
    with pytest.raises(SystemExit) as info:
        run_cli(tool.main, argv, prog='benchmark.py')
    err = capsys.readouterr().err
    assert info.value.code == 2 and name in err and 'Traceback' not in err, err
