"""``make gpu-check`` (tools/analysis_tools/gpu_check.py): its plan without a GPU, and its report."""
import json
import os
import subprocess

import pytest
import torch

from conftest import REPO_ROOT, load_tool, run_tool

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


def test_without_cuda_prints_the_plan_and_exits_0(tmp_path, monkeypatch, capsys):
    tool = load_tool('tools/analysis_tools/gpu_check.py')
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    assert tool.main(['--out-dir', str(tmp_path / 'gpu_check')]) == 0
    out = capsys.readouterr().out
    for expected in ('tests/test_ops/test_pola_attention_cuda.py', 'benchmark_attention.py --device cuda',
                     '--shapes 2x1x64000 2x2x16000', '--backward', '--train-step-worker',
                     'needs more than one GPU', 'nothing was run'):
        assert expected in out, out
    assert not (tmp_path / 'gpu_check').exists()  # nothing written


@pytest.mark.skipif(torch.cuda.is_available(), reason='on a GPU machine the script runs the whole check')
def test_make_target_runs_the_script(tmp_path):
    """`make gpu-check` runs the script (dry run of make), and the script on its own exits 0 here."""
    make = subprocess.run(['make', '-n', 'gpu-check'], cwd=REPO_ROOT, capture_output=True, text=True)
    assert make.returncode == 0 and 'tools/analysis_tools/gpu_check.py' in make.stdout, make.stdout + make.stderr
    proc = run_tool(['tools/analysis_tools/gpu_check.py', '--out-dir', str(tmp_path)], timeout=120)
    assert 'no CUDA device here' in proc.stdout


def test_shards_run_the_autotuner_test_last():
    tool = load_tool('tools/analysis_tools/gpu_check.py')
    ids = [f'f.py::test_{i}' for i in range(7)] + ['f.py::test_autotuner_picks_one_of_them']
    first, last = tool.shard(ids, 3)
    assert last == [['f.py::test_autotuner_picks_one_of_them']]
    assert len(first) == 3 and sorted(sum(first, [])) == sorted(ids[:7])
    assert tool.shard(ids[:2], 8) == [[['f.py::test_0'], ['f.py::test_1']]]


def test_summary_from_the_steps_outputs(tmp_path):
    """The report of a (simulated) run: test outcomes, benchmark figures, training-step losses, PNG."""
    tool = load_tool('tools/analysis_tools/gpu_check.py')
    bench = load_tool('tools/analysis_tools/benchmark_attention.py')
    out = tmp_path / 'gpu_check'
    (out / 'logs').mkdir(parents=True)
    (out / 'logs' / 'cuda_tests_0.xml').write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_ops.test_pola_attention_cuda" name="test_a" time="3.5"/>'
        '<testcase classname="tests.test_ops.test_pola_attention_cuda" name="test_b" time="1.0">'
        '<failure message="d=96 dq: max abs error">trace</failure></testcase>'
        '</testsuite></testsuites>')
    for name, scale in (('benchmark_forward', 1.0), ('benchmark_backward', 3.0)):
        rows = []
        for n in (4096, 65536, 200704):
            for backend, ms in (('pola-triton', 0.01 * n / 4096), ('sdpa', 0.02 * (n / 4096) ** 2),
                                ('pola-torch', 0.1 * n / 4096)):
                row = dict(backend=backend, dtype='bf16', batch=1, heads=1, head_dim=64, seq_len=n, rope='grid',
                           backward=scale > 1, device='cuda', time_ms=scale * ms, peak_mib=1.0, status='ok',
                           note='flash' if backend == 'sdpa' else '')
                rows.append(bench.add_derived(row, peak_gbps=4800.0))
        rows.append(dict(rows[0], batch=2, seq_len=64000, status='OOM', time_ms=None))
        (out / name).mkdir()
        bench.write_csv(str(out / name / 'benchmark_attention.csv'), rows)
    losses = {'loss': 5.0, 'loss_rpn_cls': 0.7}
    step = dict(losses=losses, backbone_grad_norm=2.0, step_ms=400.0, peak_mem_gib=10.0)
    (out / 'train_step.json').write_text(json.dumps(dict(
        config='configs/detection/mask-rcnn_polapp-b2_fpn_8xb2-amp-1x_coco.py', image_hw=[800, 1280], batch=2,
        amp_scope='model', attention_layers=4, device='GPU',
        backends=dict(triton=dict(step, losses={'loss': 5.001, 'loss_rpn_cls': 0.7}, step_ms=300.0), torch=step),
        loss_rel_diff={'loss': 2e-4, 'loss_rpn_cls': 0.0}, backbone_grad_norm_rel_diff=1e-3, losses_equal=True)))
    results = [dict(key='tests', title='(a) CUDA tests', status='failed (exit 1)', seconds=100.0, logs=[]),
               dict(key='train', title='(c) training step', status='ok', seconds=50.0, logs=[])]
    summary = open(tool.write_summary(str(out), results, 'GPU x 1', 150.0)).read()
    assert '1 passed, 1 failed' in summary and 'test_b` d=96 dq' in summary
    # pola-triton: 4 bytes per element of q, k, v, o at 1 GB/s-scale figures, SDPA quadratic
    fig = bench.add_derived(dict(batch=1, heads=1, seq_len=65536, head_dim=64, dtype='bf16', backward=False,
                                 status='ok', time_ms=0.16), peak_gbps=4800.0)
    assert f"{100 * fig['peak_fraction']:.0f}-" in summary
    assert '**forward**' in summary and '**forward + backward**' in summary
    assert 'x over SDPA (flash) at N=200704' in summary and 'OOM' in summary
    assert '| loss | 5.00100 | 5.00000 | 2.0e-04 |' in summary and 'speed-up 1.33x' in summary
    assert 'losses equal to 0.01: yes' in summary
    with open(out / 'gpu_check.png', 'rb') as f:
        assert f.read(8) == PNG_MAGIC
    assert {'steps.csv', 'cuda_tests.csv', 'benchmark_forward.csv', 'benchmark_backward.csv'} <= set(os.listdir(out))


def test_steps_run_in_waves_within_their_time_limit(tmp_path):
    tool = load_tool('tools/analysis_tools/gpu_check.py')
    py = [tool.sys.executable, '-c']
    ok = tool.Step('ok', 'two waves', [[py + ['print("first")'], py + ['print("second")']], [py + ['pass']]], 60)
    result = tool.run_step(ok, dict(os.environ), str(tmp_path))
    assert result['status'] == 'ok' and len(result['logs']) == 3
    assert 'second' in open(result['logs'][1]).read()
    failing = tool.Step('failing', 'one fails', [[py + ['import sys; sys.exit(3)'], py + ['pass']]], 60)
    assert tool.run_step(failing, dict(os.environ), str(tmp_path))['status'] == 'failed (exit 3)'
    slow = tool.Step('slow', 'too slow', [[py + ['import time; time.sleep(30)']]], 1)
    result = tool.run_step(slow, dict(os.environ), str(tmp_path))
    assert result['status'] == 'ran out of time (1 s)' and result['seconds'] < 20
