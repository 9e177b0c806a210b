"""Impossible arguments end every tool like argparse does: a message naming the argument, exit code 2.

Most cases call the tools' ``main`` in-process through ``run_cli`` (what their
``__main__`` runs); two run the scripts for real.
"""
import os.path as osp
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, load_tool
from polaformerpp.utils.cli import (
    ArgumentCheckError,
    MissingPathError,
    image_shape,
    positive_int,
    positive_multiple_of,
    run_cli,
    torch_device,
)

CLS_CONFIG = osp.join(REPO_ROOT, 'configs', 'classification', 'polapp-b0_1xb32-30e_demo-shapes.py')
DIT_CONFIG = osp.join(REPO_ROOT, 'configs', 'generation', 'dit-tiny-4_polapp_1xb32-2k_demo-shapes-32.py')
MISSING = osp.join(REPO_ROOT, 'no_such_dir', 'missing.pth')


def expect_exit_2(tool, argv, name, capsys):
    with pytest.raises(SystemExit) as info:
        run_cli(load_tool(tool).main, argv, prog=osp.basename(tool))
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert name in err, err
    assert 'error:' in err and 'Traceback' not in err, err
    return err


# --------------------------------------------------------------------------- the shared checks
def test_shared_checks():
    import argparse
    assert positive_int('3') == 3
    for bad in ('0', '-2', 'x', '1.5'):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_int(bad)
    by4 = positive_multiple_of(4, '2-D RoPE')
    assert by4('16') == 16
    with pytest.raises(argparse.ArgumentTypeError, match='multiple of 4'):
        by4('6')
    assert image_shape([32]) == (32, 32) and image_shape([16, 24]) == (16, 24) and image_shape(None) is None
    for bad in ([0, 0], [-3, 5], [1, 2, 3], []):
        with pytest.raises(ArgumentCheckError, match='--shape'):
            image_shape(bad)
    assert torch_device('cpu') == 'cpu'
    with pytest.raises(argparse.ArgumentTypeError):
        torch_device('gpu')
    # a missing file is a FileNotFoundError and a ValueError for Python callers
    assert issubclass(MissingPathError, FileNotFoundError) and issubclass(MissingPathError, ValueError)


# --------------------------------------------------------------------------- per tool
GET_FLOPS = 'tools/analysis_tools/get_flops.py'
BENCH_ATTN = 'tools/analysis_tools/benchmark_attention.py'
BENCH = 'tools/analysis_tools/benchmark.py'
ENTROPY = 'tools/analysis_tools/attention_entropy.py'
MAPS = 'tools/analysis_tools/vis_attention_maps.py'
SAMPLE = 'tools/generation/sample.py'
FID = 'tools/generation/fid.py'
ZOO = 'tools/model_zoo/check_results.py'

CASES = [
    (GET_FLOPS, [CLS_CONFIG, '--shape', '0', '0'], '--shape'),
    (GET_FLOPS, [CLS_CONFIG, '--shape', '-3', '64'], '--shape'),
    (GET_FLOPS, [CLS_CONFIG, '--shape', '64', '64', '3'], '--shape'),
    (GET_FLOPS, [MISSING], 'config'),
    (BENCH_ATTN, ['--seq-lens', '0'], '--seq-lens'),
    (BENCH_ATTN, ['--batch-sizes', '0'], '--batch-sizes'),
    (BENCH_ATTN, ['--heads', '-1'], '--heads'),
    (BENCH_ATTN, ['--head-dims', '6'], '--head-dims'),
    (BENCH_ATTN, ['--head-dims', '0'], '--head-dims'),
    (BENCH_ATTN, ['--repeat', '0'], '--repeat'),
    (BENCH_ATTN, ['--warmup', '-1'], '--warmup'),
    (BENCH_ATTN, ['--threads', '0'], '--threads'),
    (BENCH_ATTN, ['--peak-gbps', '-5'], '--peak-gbps'),
    (BENCH_ATTN, ['--device', 'gpu'], '--device'),
    (BENCH, [CLS_CONFIG, '--batch-size', '0'], '--batch-size'),
    (BENCH, [CLS_CONFIG, '--repeat', '0'], '--repeat'),
    (BENCH, [CLS_CONFIG, '--warmup', '-1'], '--warmup'),
    (BENCH, [CLS_CONFIG, '--shape', '0'], '--shape'),
    (BENCH, [CLS_CONFIG, '--checkpoint', MISSING], '--checkpoint'),
    (BENCH, [MISSING], 'config'),
    (ENTROPY, [CLS_CONFIG, MISSING, '--shape', '0', '32'], '--shape'),
    (ENTROPY, [CLS_CONFIG, MISSING, '--num-random', '0'], '--num-random'),
    (ENTROPY, [CLS_CONFIG, MISSING, '--max-queries', '-1'], '--max-queries'),
    (ENTROPY, [CLS_CONFIG, MISSING], 'checkpoint'),
    (MAPS, [CLS_CONFIG, MISSING, '--shape', '64', '--query', '64', '10'], '--query'),
    (MAPS, [CLS_CONFIG, MISSING, '--shape', '64', '--query', '10', '-1'], '--query'),
    (MAPS, [CLS_CONFIG, MISSING, '--head', '-1'], '--head'),
    (MAPS, [CLS_CONFIG, MISSING, '--shape', '1', '2', '3'], '--shape'),
    ('tools/analysis_tools/vis_temperatures.py', [CLS_CONFIG, MISSING], 'checkpoint'),
    ('tools/analysis_tools/vis_polarity_mixing.py', [MISSING, MISSING], 'config'),
    (SAMPLE, [DIT_CONFIG, MISSING, '--out-dir', 'x', '--num-samples', '0'], '--num-samples'),
    (SAMPLE, [DIT_CONFIG, MISSING, '--out-dir', 'x', '--steps', '0'], '--steps'),
    (SAMPLE, [DIT_CONFIG, MISSING, '--out-dir', 'x', '--cfg-scale', '-1'], '--cfg-scale'),
    (SAMPLE, [DIT_CONFIG, MISSING, '--out-dir', 'x', '--cfg-scale', '0.5'], '--cfg-scale'),
    (SAMPLE, [DIT_CONFIG, MISSING, '--out-dir', 'x', '--batch-size', '0'], '--batch-size'),
    (SAMPLE, [DIT_CONFIG, MISSING, '--out-dir', 'x', '--eta', '-0.5'], '--eta'),
    (SAMPLE, [DIT_CONFIG, MISSING, '--out-dir', 'x', '--labels', '1', '-2'], '--labels'),
    (SAMPLE, [DIT_CONFIG, MISSING, '--out-dir', 'x'], 'checkpoint not found'),
    (FID, [MISSING, MISSING], 'not found'),
    (FID, [REPO_ROOT, REPO_ROOT, '--batch-size', '0'], '--batch-size'),
    (FID, [REPO_ROOT, REPO_ROOT, '--is-splits', '0'], '--is-splits'),
    (ZOO, ['--gpus', '0'], '--gpus'),
    (ZOO, ['--list', MISSING], '--list'),
    (ZOO, ['--model-index', MISSING], '--model-index'),
    (ZOO, ['--dry-run', '--models', 'no-such-model*'], '--models'),
]


@pytest.mark.parametrize('tool,argv,name', CASES,
                         ids=[f'{osp.basename(t)}:{" ".join(osp.basename(x) for x in a[-2:])}'
                              for t, a, _ in CASES])
def test_impossible_argument_exits_2(tool, argv, name, capsys):
    expect_exit_2(tool, argv, name, capsys)


def test_fid_folder_checks(tmp_path, capsys):
    """Missing folders are named; image folders need Inception weights that exist."""
    folder = tmp_path / 'images'
    folder.mkdir()
    err = expect_exit_2(FID, [str(folder), str(tmp_path / 'gone')], 'second', capsys)
    assert 'gone' in err
    expect_exit_2(FID, [str(folder), str(folder)], '--inception', capsys)
    expect_exit_2(FID, [str(folder), str(folder), '--inception', str(tmp_path / 'w.pth')], '--inception', capsys)


@pytest.fixture(scope='module')
def dit_checkpoint(tmp_path_factory):
    """A checkpoint of the (untrained) pixel-space DiT of ``DIT_CONFIG`` (4 classes)."""
    import torch
    from mmengine.config import Config
    from mmengine.registry import MODELS, init_default_scope
    from mmengine.utils import import_modules_from_strings

    import polaformerpp.generation  # noqa: F401
    cfg = Config.fromfile(DIT_CONFIG)
    import_modules_from_strings(**cfg.custom_imports)
    init_default_scope(cfg.get('default_scope', 'mmengine') or 'mmengine')
    model = MODELS.build(cfg.model)
    path = tmp_path_factory.mktemp('dit') / 'dit.pth'
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, path)
    return str(path)


def test_sample_labels_outside_the_classes(dit_checkpoint, tmp_path, capsys):
    """Caught from the built model, before any sampling: nothing is written."""
    out = tmp_path / 'out'
    err = expect_exit_2(SAMPLE, [DIT_CONFIG, dit_checkpoint, '--out-dir', str(out), '--labels', '0', '4',
                                 '--steps', '1', '--no-progress'], '--labels', capsys)
    assert '4 classes' in err and not out.exists()


def test_attention_map_query_check_in_process():
    """In-process callers of the checks get a ValueError."""
    maps = load_tool(MAPS)
    with pytest.raises(ValueError, match='--query'):
        maps.check_query((5, 70), [64, 64])
    maps.check_query((63, 0), [64, 64])


@pytest.mark.slow
@pytest.mark.parametrize('argv,name', [
    ([GET_FLOPS, CLS_CONFIG, '--shape', '0', '0'], '--shape'),
    ([FID, MISSING, MISSING], 'first'),
])
def test_scripts_exit_2(argv, name):
    proc = subprocess.run([sys.executable, *argv], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert name in proc.stderr and 'Traceback' not in proc.stderr, proc.stderr
    assert proc.stdout == ''
