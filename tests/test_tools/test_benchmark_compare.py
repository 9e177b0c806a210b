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


@pytest.mark.slow  # four networks timed, profiled and counted at two sizes: about 15 s
def test_compare_writes_table_csv_and_plot(tool, tmp_path, capsys):
    threads = torch.get_num_threads()
    try:
        rows = tool.main([B0, '--compare', 'swin-t', 'convnext-t', '--resolutions', '64', '96', '--device', 'cpu',
                          '--threads', '1', '--warmup', '0', '--repeat', '1', '--out-dir', str(tmp_path),
                          '--modes', 'inference', 'train', '--profile', '--profile-rows', '3'])
    finally:
        torch.set_num_threads(threads)
    models = ['polapp-b0 L-L-S-S', 'polapp-b0 all-linear', 'swin-t', 'convnext-t']
    modes = ['inference', 'train']
    assert [(r['model'], r['resolution'], r['mode']) for r in rows] == [
        (m, s, mode) for s in (64, 96) for mode in modes for m in models]
    assert all(r['status'] == 'ok' and r['latency_ms'] > 0 and r['peak_memory_mib'] > 0 for r in rows)
    params = {r['model']: r['params'] for r in rows}
    # the dense backbones: four stage outputs, no classification projection / head (7.55M with them);
    # linear attention adds its temperatures
    assert 3e6 < params['polapp-b0 L-L-S-S'] < params['polapp-b0 all-linear'] < 7_548_712
    assert 27e6 < params['swin-t'] < 28.5e6 and 27e6 < params['convnext-t'] < 28.5e6
    cell = {(r['model'], r['resolution'], r['mode']): r for r in rows}
    for m in models:
        # memory grows with the input (activations of 96^2 > 64^2); a training step keeps its activations
        assert cell[(m, 96, 'inference')]['peak_memory_mib'] > cell[(m, 64, 'inference')]['peak_memory_mib']
        assert cell[(m, 96, 'train')]['peak_memory_mib'] > cell[(m, 96, 'inference')]['peak_memory_mib']
        # MACs from mmengine's counter: quadratic in the side for the per-pixel networks (Swin pads
        # maps below a window), a training step three forwards
        ratio = cell[(m, 96, 'inference')]['macs_g'] / cell[(m, 64, 'inference')]['macs_g']
        assert m == 'swin-t' or 1.8 < ratio < 2.8, (m, ratio)
        assert cell[(m, 96, 'train')]['macs_g'] == pytest.approx(3 * cell[(m, 96, 'inference')]['macs_g'])
    for r in rows:  # efficiency as defined, from the rate measured in the same rounds
        assert r['sgemm_gflops'] > 0
        assert r['efficiency'] == pytest.approx(2 * r['macs_g'] / (r['latency_ms'] / 1e3) / r['sgemm_gflops'])
        assert 'Self CPU' in r['profile']
    # ConvNeXt-T's 4.5 GMACs at 224^2 (mmpretrain's model zoo) scale to 96^2 within the stem's rounding
    assert cell[('convnext-t', 96, 'inference')]['macs_g'] == pytest.approx(4.47 * (96 / 224) ** 2, rel=0.05)
    out = capsys.readouterr().out
    assert 'latency (ms)' in out and 'peak memory (MiB)' in out and 'efficiency' in out and 'MACs (G)' in out
    assert '== train' in out and '== inference' in out and 'operators of swin-t, 96^2, train' in out
    assert 'polapp-b0 all-linear vs swin-t' in out and 'polapp-b0 L-L-S-S vs fastest peer' in out
    with open(tmp_path / 'benchmark_compare.csv') as f:
        table = list(csv.DictReader(f))
    assert len(table) == 16 and table[0]['model'] == 'polapp-b0 L-L-S-S' and float(table[0]['latency_ms']) > 0
    assert float(table[0]['efficiency']) > 0 and table[4]['mode'] == 'train'
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
