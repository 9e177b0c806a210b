"""tools/model_converters/polapp_official2mm.py: loading, the command line, the written checkpoint.

The key mapping itself is tested in tests/test_models/test_polaformerpp_convert.py.
"""
import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from conftest import REPO_ROOT, built_once, load_tool

REPO = Path(REPO_ROOT)
CONVERTER = REPO / 'tools' / 'model_converters' / 'polapp_official2mm.py'
B0_CONFIG = REPO / 'configs' / 'classification' / 'polapp-b0_8xb256_in1k.py'

conv = load_tool('tools/model_converters/polapp_official2mm.py')
ref = load_tool('tests/test_models/authors_reference.py')


def run_cli(*args):
    env = dict(os.environ, OMP_NUM_THREADS='1')
    return subprocess.Popen([sys.executable, str(CONVERTER), *map(str, args)], cwd=str(REPO), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope='module', autouse=True)
def _one_thread():
    """These models are tiny: one thread avoids oversubscription on busy CI machines."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _convert_b0(folder):
    """The authors'-format checkpoints (seeded reference models) and the two CLI runs, started in
    parallel; their exit codes and output in ``runs.json``."""
    model, ema = ref.authors_model('b0', seed=0), ref.authors_model('b0', seed=1)
    src = folder / 'official_b0.pth'
    torch.save({'model': model.state_dict(), 'state_dict_ema': ema.state_dict(), 'epoch': 299}, src)
    torch.save({'model': ref.broken_state_dict(model.state_dict())}, folder / 'bad.pth')
    jobs = {'plain': (run_cli(src, folder / 'mm_b0.pth'), 'mm_b0.pth'),
            'bad': (run_cli(folder / 'bad.pth', folder / 'mm_bad.pth'), 'mm_bad.pth')}
    runs = {}
    for name, (proc, dst) in jobs.items():
        out, _ = proc.communicate(timeout=120)
        runs[name] = (proc.returncode, out, dst)
    (folder / 'runs.json').write_text(json.dumps(runs))


@pytest.fixture(scope='module')
def b0(tmp_path_factory):
    """Reference models, their authors'-format checkpoint and two CLI runs (converted once per
    test run, shared by the xdist workers), and a folder of this module's own."""
    shared = built_once(tmp_path_factory, 'polapp_official2mm_b0', _convert_b0)
    src = shared / 'official_b0.pth'
    weights = torch.load(src, map_location='cpu', weights_only=True)
    model, ema = ref.authors_model('b0', seed=0), ref.authors_model('b0', seed=1)
    model.load_state_dict(weights['model'])
    ema.load_state_dict(weights['state_dict_ema'])
    runs = {name: (rc, out, shared / dst)
            for name, (rc, out, dst) in json.loads((shared / 'runs.json').read_text()).items()}
    tmp = tmp_path_factory.mktemp('polapp_conv')
    shutil.copy(shared / 'bad.pth', tmp / 'bad.pth')
    return dict(model=model, ema=ema, src=src, runs=runs, tmp=tmp)


def test_cli_into_config_classifier(b0):
    rc, out, dst = b0['runs']['plain']
    assert rc == 0, out
    assert 'arch b0' in out
    ckpt = torch.load(dst, map_location='cpu', weights_only=True)
    assert set(ckpt) == {'state_dict', 'meta'}
    meta = ckpt['meta']
    assert meta['arch'] == 'b0' and meta['num_classes'] == 1000 and meta['source_weights'] == 'model'
    assert meta['attn_types'] == list(ref.RELEASED_ATTN) and meta['complete'] is True

    pytest.importorskip('mmpretrain')
    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS

    import polaformerpp  # noqa: F401  (registers PolaFormerPP)
    assert B0_CONFIG.is_file(), f'{B0_CONFIG} is missing'
    cfg = Config.fromfile(str(B0_CONFIG))
    model_cfg = copy.deepcopy(cfg.model)
    model_cfg.pop('train_cfg', None)  # Mixup/CutMix: training only
    # the config's own scope: an earlier test in this process may have left another one current
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        classifier = MODELS.build(model_cfg).eval()  # init_cfg is not applied (no init_weights)
    classifier.load_state_dict(ckpt['state_dict'], strict=True)

    class Logits(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(x, mode='tensor')

    ref.assert_same_logits(Logits(classifier), b0['model'])


def test_ema_picks_ema_weights(b0, capsys):
    dst = b0['tmp'] / 'mm_b0_ema.pth'
    assert conv.main([str(b0['src']), str(dst), '--ema']) == 0  # the CLI entry point, in-process
    assert 'state_dict_ema' in capsys.readouterr().out
    ckpt = torch.load(dst, map_location='cpu', weights_only=True)
    assert ckpt['meta']['source_weights'] == 'state_dict_ema'
    sd = ckpt['state_dict']
    ema, plain = b0['ema'], b0['model']
    torch.testing.assert_close(sd['backbone.stem.0.conv.weight'], ema.patch_embed.proj[0].weight.detach())
    assert not torch.equal(sd['backbone.stem.0.conv.weight'], plain.patch_embed.proj[0].weight.detach())
    ours = ref.project_classifier('b0', 1000)
    ours.load_state_dict(sd, strict=True)
    ref.assert_same_logits(ours, ema, sizes=((1, 64, 64), ))


def test_unknown_and_missing_keys_fail_the_cli(b0):
    extra = 'layers.1.blocks.0.attn.extra_scale'
    missing = 'backbone.stages.1.blocks.1.attn.lepe.bias'
    rc, out, dst = b0['runs']['bad']
    assert rc != 0
    assert extra in out and missing in out
    assert not dst.exists()

    partial = b0['tmp'] / 'partial.pth'
    with pytest.raises(conv.CheckpointFormatError, match=re.escape(extra)):
        conv.convert_file(str(b0['tmp'] / 'bad.pth'), str(partial), log=lambda *a: None)
    assert not partial.exists()
    report = conv.convert_file(str(b0['tmp'] / 'bad.pth'), str(partial), allow_partial=True,
                               log=lambda *a: None)
    assert not report.ok
    assert torch.load(partial, weights_only=True)['meta']['complete'] is False


def test_checkpoint_containers(b0, tmp_path):
    sd = b0['model'].state_dict()
    for obj, entry in ((sd, '<bare>'), ({'state_dict': sd}, 'state_dict'),
                       ({'model': {f'module.{k}': v for k, v in sd.items()}}, 'model')):
        path = tmp_path / 'ckpt.pth'
        torch.save(obj, path)
        loaded, name = conv.load_official_checkpoint(str(path))
        assert name == entry
        new_sd, report = conv.convert_official_state_dict(loaded)
        assert report.ok, report.problems()


def test_not_a_checkpoint(b0, tmp_path, capsys):
    text = tmp_path / 'notes.txt'
    text.write_text('not a checkpoint')
    with pytest.raises(conv.CheckpointFormatError, match='not a loadable torch checkpoint'):
        conv.load_official_checkpoint(str(text))
    assert conv.main([str(text), str(tmp_path / 'out.pth')]) == 1
    assert 'not a loadable torch checkpoint' in capsys.readouterr().err

    no_weights = tmp_path / 'opt.pth'
    torch.save({'optimizer': {'lr': 0.1}, 'epoch': 3}, no_weights)
    with pytest.raises(conv.CheckpointFormatError, match='no weights found'):
        conv.load_official_checkpoint(str(no_weights))
    with pytest.raises(conv.CheckpointFormatError, match='no EMA weights'):
        conv.load_official_checkpoint(str(b0['tmp'] / 'bad.pth'), ema=True)
    with pytest.raises(FileNotFoundError):
        conv.load_official_checkpoint(str(tmp_path / 'nope.pth'))
    with pytest.raises(conv.CheckpointFormatError, match='4 stages'):
        conv.convert_official_state_dict({'conv.weight': torch.zeros(3, 3)})
