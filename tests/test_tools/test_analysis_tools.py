"""The analysis and model-zoo tools end to end on a small classifier checkpoint made here."""
import json
import math
import os.path as osp

import numpy as np
import pytest
import torch

from conftest import REPO_ROOT, load_tool
from polaformerpp.analysis import load_model

DEMO_CONFIG = osp.join(REPO_ROOT, 'configs', 'classification', 'polapp-b0_1xb32-30e_demo-shapes.py')
TINY_ARCH = dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 4],
                 cls_proj_channels=64)
PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


# --------------------------------------------------------------------------- tools end to end
@pytest.fixture(scope='module')
def tiny_classifier(tmp_path_factory):
    """A tiny PolaFormer++ classifier config (demo set classes, 32 px) and a checkpoint trained
    for a few steps on random images, in mmengine's checkpoint format."""
    root = tmp_path_factory.mktemp('tiny_cls')
    config = root / 'polapp-tiny_demo.py'
    config.write_text(
        f"_base_ = [{DEMO_CONFIG!r}]\n"
        f"model = dict(backbone=dict(arch=dict(_delete_=True, **{TINY_ARCH!r})),\n"
        f"             head=dict(in_channels={TINY_ARCH['cls_proj_channels']}))\n")
    model = load_model(str(config))
    model.train()
    from mmpretrain.structures import DataSample
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for step in range(3):
        images = [torch.randint(0, 256, (3, 32, 32), generator=generator, dtype=torch.uint8)
                  for _ in range(8)]
        data = model.data_preprocessor(
            dict(inputs=images, data_samples=[DataSample().set_gt_label(i % 4) for i in range(8)]), True)
        loss = sum(model(data['inputs'], data['data_samples'], mode='loss').values())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    checkpoint = root / 'tiny.pth'
    torch.save({'state_dict': model.state_dict(), 'meta': {'steps': 3}}, checkpoint)
    return str(config), str(checkpoint)


@pytest.fixture(scope='module')
def shape_image(tmp_path_factory):
    draw_sample = load_tool('tools/misc/make_demo_data.py').draw_sample
    path = tmp_path_factory.mktemp('img') / 'disk.png'
    draw_sample(0, 64, np.random.default_rng(0)).save(path)
    return str(path)


def assert_png(path):
    assert osp.isfile(path), path
    with open(path, 'rb') as f:
        assert f.read(8) == PNG_MAGIC


def test_attention_entropy_tool(tiny_classifier, tmp_path, capsys):
    config, checkpoint = tiny_classifier
    tool = load_tool('tools/analysis_tools/attention_entropy.py')
    rows = tool.main([config, checkpoint, '--shape', '32', '--num-random', '2', '--out-dir', str(tmp_path)])
    out = capsys.readouterr().out
    assert 'stages.0.blocks.0' in out and 'stages.1.blocks.0' in out and 'pola-same' in out
    # stage 1: 1 head on 8x8 tokens, stage 2: 2 heads on 4x4
    assert [(r['layer'], r['head'], r['tokens']) for r in rows] == [
        ('backbone.stages.0.blocks.0.attn', 0, 64), ('backbone.stages.1.blocks.0.attn', 0, 16),
        ('backbone.stages.1.blocks.0.attn', 1, 16)]
    for row in rows:
        for method in ('softmax', 'elu+1', 'pola-same'):
            assert 0 < row[method] <= math.log(row['tokens']) + 1e-6
        assert 0 <= row['pola-same/neg'] < 0.5  # RoPE makes part of the weights negative
    assert_png(tmp_path / 'attention_entropy.png')
    with open(tmp_path / 'attention_entropy.json') as f:
        assert len(json.load(f)['rows']) == 3


def test_vis_temperatures_tool(tiny_classifier, tmp_path, capsys):
    config, checkpoint = tiny_classifier
    summary = load_tool('tools/analysis_tools/vis_temperatures.py').main(
        [config, checkpoint, '--out-dir', str(tmp_path)])
    assert sorted(summary) == ['backbone.stages.0.blocks.0.attn', 'backbone.stages.1.blocks.0.attn']
    first = summary['backbone.stages.0.blocks.0.attn']['q+: same vs opp']
    assert first['mean_abs_gap'] > 0  # training moved the temperatures off their 0.5 start
    assert 'mean|x-y|' in capsys.readouterr().out
    assert_png(tmp_path / 'temperatures.png')


def test_vis_polarity_mixing_tool(tiny_classifier, tmp_path, capsys):
    config, checkpoint = tiny_classifier
    summary = load_tool('tools/analysis_tools/vis_polarity_mixing.py').main(
        [config, checkpoint, '--out-dir', str(tmp_path)])
    layer = summary['backbone.stages.1.blocks.0.attn']
    assert len(layer['coords']) == 32 and layer['stream'].count(1) == 16
    assert 'separation' in capsys.readouterr().out
    assert_png(tmp_path / 'polarity_mixing.png')


def test_vis_attention_maps_tool(tiny_classifier, shape_image, tmp_path):
    config, checkpoint = tiny_classifier
    png = load_tool('tools/analysis_tools/vis_attention_maps.py').main(
        [config, checkpoint, '--img', shape_image, '--shape', '64', '--query', '20', '40',
         '--out-dir', str(tmp_path)])
    assert_png(png)
    with pytest.raises(ValueError, match='not a linear attention layer'):
        load_tool('tools/analysis_tools/vis_attention_maps.py').main(
            [config, checkpoint, '--shape', '32', '--layers', 'stages.3.blocks.0',
             '--out-dir', str(tmp_path)])


def test_benchmark_tool(tiny_classifier, tmp_path, capsys):
    config, checkpoint = tiny_classifier
    out_json = str(tmp_path / 'bench.json')
    result = load_tool('tools/analysis_tools/benchmark.py').main(
        [config, '--checkpoint', checkpoint, '--shape', '32', '--batch-size', '2', '--device', 'cpu',
         '--warmup', '1', '--repeat', '2', '--out-json', out_json])
    assert result['images_per_s'] > 0 and result['repeat'] == 2 and result['min_s'] <= result['median_s']
    assert 'images/s' in capsys.readouterr().out
    with open(out_json) as f:
        assert json.load(f)['batch_size'] == 2


@pytest.mark.parametrize('rope_form', ['grid', 'tables'])
def test_benchmark_attention_tool(tmp_path, capsys, rope_form):
    """Every CPU backend runs, outputs agree, the CSV holds one row per cell and the plot is written."""
    import csv

    from polaformerpp.ops import available_backends
    tool = load_tool('tools/analysis_tools/benchmark_attention.py')
    backends = ['pola-torch', 'pola-cpu', 'sdpa', 'naive']
    results = tool.main(['--device', 'cpu', '--seq-lens', '64', '300', '--head-dims', '16',
                         '--heads', '2', '--backends', *backends, '--repeat', '2', '--warmup', '1',
                         '--no-isolate', '--rope-form', rope_form, '--out-dir', str(tmp_path)])
    ran = [b for b in backends if b != 'pola-cpu' or 'cpu' in available_backends()]
    assert [(r['backend'], r['seq_len']) for r in results] == [(b, n) for n in (64, 300) for b in ran]
    assert all(r['status'] == 'ok' and r['time_ms'] > 0 and r['tokens_per_s'] > 0 for r in results)
    assert {r['rope'] for r in results} == {rope_form}
    for r in results:  # the pola backends' fp32 forward against their GEMM floor: 8 B h N d^2 FLOPs
        if r['backend'].startswith('pola'):
            assert r['sgemm_gflops'] > 0
            assert r['floor_ms'] == pytest.approx(8 * 2 * r['seq_len'] * 16 ** 2 / (r['sgemm_gflops'] * 1e6))
            assert r['x_floor'] == pytest.approx(r['time_ms'] / r['floor_ms'])
        else:
            assert r['floor_ms'] is None and r['x_floor'] is None
    out = capsys.readouterr().out
    assert 'x floor' in out
    for backend in ran:
        if backend in ('naive', 'pola-cpu'):
            diff = float(out.split(f'{backend} vs pola-torch')[1].split('max |diff| = ')[1].split()[0])
            assert diff < 1e-4, out
    with open(tmp_path / 'benchmark_attention.csv') as f:
        assert len(list(csv.DictReader(f))) == len(results)
    assert_png(str(tmp_path / 'benchmark_attention.png'))


def test_benchmark_attention_shapes_add_cells(tmp_path):
    """--shapes BxHxN cells come after the sweep; a malformed one is refused naming the option."""
    tool = load_tool('tools/analysis_tools/benchmark_attention.py')
    results = tool.main(['--device', 'cpu', '--seq-lens', '32', '--head-dims', '8', '--backends', 'pola-torch',
                         '--shapes', '2x2x48', '--repeat', '1', '--warmup', '0', '--no-isolate', '--out-dir', ''])
    assert [(r['batch'], r['heads'], r['seq_len']) for r in results] == [(1, 1, 32), (2, 2, 48)]
    assert all(r['status'] == 'ok' for r in results)
    with pytest.raises(SystemExit):
        tool.parse_args(['--shapes', '2x48'])


# --------------------------------------------------------------------------- model zoo
def test_model_index_lists_every_task_and_dry_run(capsys, tmp_path):
    tool = load_tool('tools/model_zoo/check_results.py')
    models = tool.load_metafile_models(osp.join(REPO_ROOT, 'model-index.yml'))
    folders = {m['_metafile'].split('/')[1] for m in models}
    assert folders == {'classification', 'detection', 'segmentation', 'super_resolution', 'generation'}
    for model in models:
        assert osp.isfile(osp.join(REPO_ROOT, model['Config'])), model['Config']
    rows = tool.main(['--dry-run', '--models', 'polapp-b*_in1k', '--checkpoint-dir', str(tmp_path)])
    assert [r['published'] for r in rows] == [76.9, 79.1, 82.8, 84.3, 85.4, 85.6]
    assert all(r['status'] == 'no checkpoint' for r in rows)
    assert '| polapp-b0_8xb256_in1k' in capsys.readouterr().out


def test_measured_metric_names():
    measured_value = load_tool('tools/model_zoo/check_results.py').measured_value
    metrics = {'accuracy/top1': 76.5, 'coco/bbox_mAP': 0.471, 'Set5/PSNR': 32.5, 'PSNR': 30.0,
               'gen/FID': 9.5}
    assert measured_value(metrics, 'Top 1 Accuracy') == ('accuracy/top1', 76.5)
    assert measured_value(metrics, 'box AP')[1] == pytest.approx(47.1)
    assert measured_value(metrics, 'PSNR', 'Set5', single_dataset=False) == ('Set5/PSNR', 32.5)
    assert measured_value(metrics, 'PSNR', 'Set14', single_dataset=False) is None
    assert measured_value(metrics, 'FID') == ('gen/FID', 9.5)
    assert measured_value(metrics, 'mask AP') is None


@pytest.mark.slow
def test_check_results_reproduces_a_table(tiny_classifier, demo_in1k, tmp_path, capsys):
    config, checkpoint = tiny_classifier
    cfg_options = []
    for key in ('val_dataloader', 'test_dataloader'):
        cfg_options += [f'{key}.dataset.data_root={demo_in1k}', f'{key}.num_workers=0',
                        f'{key}.dataset.pipeline.1.scale=32', f'{key}.dataset.pipeline.2.crop_size=32']
    run_list = tmp_path / 'runs.yml'
    run_list.write_text(json.dumps([dict(
        name='polapp-tiny_demo', config=config, checkpoint=checkpoint, cfg_options=cfg_options,
        results=[dict(Dataset='demo shapes', Metrics={'Top 1 Accuracy': 25.0})])]))
    out_md = str(tmp_path / 'table.md')
    # its command line in this process; the evaluation it starts (tools/test.py) is a process of its own
    capsys.readouterr()
    load_tool('tools/model_zoo/check_results.py').main(['--list', str(run_list), '--work-dir', str(tmp_path / 'zoo'),
                                                        '--out', out_md])
    table = capsys.readouterr().out
    assert '| model' in table and 'polapp-tiny_demo' in table, table
    row = next(line for line in table.splitlines() if 'polapp-tiny_demo' in line)
    cells = [c.strip() for c in row.strip('|').split('|')]
    published, measured, diff, status = float(cells[3]), float(cells[4]), float(cells[5]), cells[6]
    assert status == 'ok' and published == 25.0 and 0 <= measured <= 100
    assert diff == pytest.approx(measured - published, abs=0.01)
    with open(osp.join(tmp_path, 'zoo', 'polapp-tiny_demo', 'metrics.json')) as f:
        assert json.load(f)['accuracy/top1'] == pytest.approx(measured, abs=0.01)
    assert osp.isfile(out_md)


def test_benchmark_tool_bar_goes_to_a_terminal_stderr_only(tiny_classifier, monkeypatch, capsys):
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    config, checkpoint = tiny_classifier
    monkeypatch.delenv('POLAPP_NO_PROGRESS', raising=False)
    argv = [config, '--checkpoint', checkpoint, '--shape', '32', '--device', 'cpu', '--warmup', '1',
            '--repeat', '3']
    for extra, expect_bar in (([], True), (['--no-progress'], False)):
        terminal = Terminal()
        monkeypatch.setattr(sys, 'stderr', terminal)
        load_tool('tools/analysis_tools/benchmark.py').main(argv + extra)
        assert ('4/4' in terminal.getvalue()) == expect_bar, terminal.getvalue()
        out = capsys.readouterr().out
        assert 'images/s' in out and '4/4' not in out
