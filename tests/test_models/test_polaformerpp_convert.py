"""The authors' checkpoint layout -> PolaFormerPP: key mapping, arch inference, RoPE buffers.

A synthetic authors'-format checkpoint of an independent re-implementation of
their classifier (``authors_reference.py`` beside this file) is converted and
must give the same logits in the project's classifier.
"""
import re
from pathlib import Path

import pytest
import torch

from conftest import load_tool
from polaformerpp.models.backbones.polaformerpp_convert import (
    AUTHORS_QKV_NAMES,
    CheckpointFormatError,
    convert_key,
    convert_official_state_dict,
    expected_rope_angle,
    infer_arch,
    official_key,
)

HERE = Path(__file__).resolve().parent
KEYS_FILE = HERE / 'authors_checkpoint_keys_b0.txt'
ref = load_tool('tests/test_models/authors_reference.py')
ARCHS, RELEASED_ATTN = ref.ARCHS, ref.RELEASED_ATTN


@pytest.fixture(scope='module', autouse=True)
def _one_thread():
    """These models are tiny: one thread avoids oversubscription on busy CI machines."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope='module')
def b0():
    """The reference b0 with randomised weights, and a broken copy of its state_dict."""
    model = ref.authors_model('b0', seed=0)
    return dict(model=model, bad_sd=ref.broken_state_dict(model.state_dict()))


# ============================================================================ the reference itself
def test_reference_matches_authors_key_list():
    expected = []
    for line in KEYS_FILE.read_text().splitlines():
        if line.strip() and not line.startswith('#'):
            m = re.fullmatch(r'(\S+) \(([\d, ]*)\) (\w+)', line.strip())
            assert m, line
            shape = tuple(int(s) for s in m.group(2).replace(' ', '').split(',') if s)
            expected.append((m.group(1), shape, m.group(3)))
    with torch.device('meta'):
        sd = ref.AuthorsPolaFormerPP(*ARCHS['b0'][:4]).state_dict()
    got = [(k, tuple(v.shape), str(v.dtype).replace('torch.', '')) for k, v in sd.items()]
    assert got == expected


@pytest.mark.parametrize('arch', sorted(ARCHS))
def test_reference_param_counts_and_arch_inference(arch):
    dims, depths, heads, proj, params = ARCHS[arch]
    with torch.device('meta'):
        model = ref.AuthorsPolaFormerPP(dims, depths, heads, proj)
    assert sum(p.numel() for p in model.parameters()) == params  # the published count
    inferred = infer_arch(model.state_dict())
    assert inferred['name'] == arch
    assert (inferred['embed_dims'], inferred['depths'], inferred['num_heads']) == (dims, depths, heads)
    assert inferred['cls_proj_channels'] == proj and inferred['num_classes'] == 1000
    assert inferred['attn_types'] == list(RELEASED_ATTN)


# ============================================================================ keys
def test_every_authors_key_maps_and_maps_back():
    """``official_key`` inverts ``convert_key`` for every b0 key (the RoPE buffers are dropped)."""
    with torch.device('meta'):
        sd = ref.AuthorsPolaFormerPP(*ARCHS['b0'][:4]).state_dict()
    for key in sd:
        hit = convert_key(key)
        if key.endswith('.angle'):
            assert hit is None
            continue
        assert hit is not None, key
        assert official_key(hit[0], RELEASED_ATTN) == key
    # one project name for the authors' two projection names
    assert convert_key('layers.0.blocks.1.attn.qkvg.weight')[0] == 'backbone.stages.0.blocks.1.attn.in_proj.weight'
    assert convert_key('layers.3.blocks.0.attn.qkvo.bias')[0] == 'backbone.stages.3.blocks.0.attn.in_proj.bias'
    assert official_key('backbone.stages.2.blocks.0.attn.in_proj.weight') == 'layers.2.blocks.0.attn.qkvo.weight'
    assert official_key('backbone.stages.2.blocks.0.attn.in_proj.weight',
                        ('linear', ) * 4) == 'layers.2.blocks.0.attn.qkvg.weight'
    assert AUTHORS_QKV_NAMES == {'linear': 'qkvg', 'softmax': 'qkvo'}
    assert official_key('backbone.not_a_key') is None


@pytest.mark.parametrize('head_dim', [4, 16, 32, 64])
def test_expected_rope_angle_is_the_authors_buffer(head_dim):
    layer = ref.BasicLayer(head_dim, None, 1, 1, 'linear')
    torch.testing.assert_close(expected_rope_angle(head_dim // 2), layer.RoPE.angle, rtol=0, atol=0)
    torch.testing.assert_close(expected_rope_angle(head_dim), layer.RoPE_linear.angle, rtol=0, atol=0)


# ============================================================================ conversion
def test_convert_function_b0_reproduces_logits(b0):
    model = b0['model']
    new_sd, report = convert_official_state_dict(model.state_dict())
    assert report.ok, report.problems()
    assert report.arch['name'] == 'b0'
    assert len(report.dropped) == 8 and all('angle' in k for k, _ in report.dropped)
    assert not report.warnings
    assert len(report.mapped) + len(report.dropped) == len(model.state_dict())
    assert new_sd['backbone.stages.0.blocks.1.attn.temp_same'].shape == (1, 64)
    torch.testing.assert_close(new_sd['backbone.stages.1.blocks.0.attn.temp_opp'],
                               model.layers[1].blocks[0].attn.s2.detach().reshape(2, 64))
    torch.testing.assert_close(new_sd['backbone.stages.3.blocks.1.gamma2'],
                               model.layers[3].blocks[1].gamma_2.detach().flatten())
    torch.testing.assert_close(new_sd['head.fc.weight'], model.head.weight.detach().flatten(1))
    torch.testing.assert_close(new_sd['backbone.stages.0.blocks.0.attn.in_proj.weight'],
                               model.layers[0].blocks[0].attn.qkvg.weight.detach())
    torch.testing.assert_close(new_sd['backbone.stages.2.blocks.1.attn.in_proj.bias'],
                               model.layers[2].blocks[1].attn.qkvo.bias.detach())

    ours = ref.project_classifier('b0', 1000)
    ours.load_state_dict(new_sd, strict=True)
    ref.assert_same_logits(ours, model)


def test_unknown_and_missing_keys_are_reported(b0):
    extra = 'layers.1.blocks.0.attn.extra_scale'
    missing = 'backbone.stages.1.blocks.1.attn.lepe.bias'
    _, report = convert_official_state_dict(b0['bad_sd'])
    assert not report.ok
    assert report.unknown == [extra]
    assert report.missing == [f'{missing} (from layers.1.blocks.1.attn.lepe.bias)']
    assert any(extra in line for line in report.problems())


def test_missing_projection_names_the_authors_key(b0):
    sd = dict(b0['model'].state_dict())
    del sd['layers.2.blocks.1.attn.qkvo.bias']
    _, report = convert_official_state_dict(sd)
    assert report.missing == ['backbone.stages.2.blocks.1.attn.in_proj.bias '
                              '(from layers.2.blocks.1.attn.qkvo.bias)']


def test_shape_mismatch_is_reported(b0):
    sd = dict(b0['model'].state_dict())
    sd['layers.0.blocks.0.ffn.fc2.bias'] = torch.zeros(31)
    _, report = convert_official_state_dict(sd)
    assert not report.ok
    assert len(report.shape_mismatch) == 1
    assert 'backbone.stages.0.blocks.0.ffn.fc2.bias' in report.shape_mismatch[0]


def test_rope_buffers_checked_and_dropped(b0):
    sd = dict(b0['model'].state_dict())
    sd['layers.2.RoPE.angle'] = sd['layers.2.RoPE.angle'] * 1.01
    with pytest.warns(UserWarning, match='layers.2.RoPE.angle'):
        new_sd, report = convert_official_state_dict(sd)
    assert report.ok and len(report.warnings) == 1
    assert not any('angle' in k or 'RoPE' in k for k in new_sd)


def test_module_prefix_is_removed(b0):
    sd = {f'module.{k}': v for k, v in b0['model'].state_dict().items()}
    new_sd, report = convert_official_state_dict(sd)
    assert report.ok, report.problems()
    assert 'backbone.stem.0.conv.weight' in new_sd


def test_not_an_authors_state_dict():
    with pytest.raises(CheckpointFormatError, match='4 stages'):
        convert_official_state_dict({'conv.weight': torch.zeros(3, 3)})


def test_custom_arch_all_linear():
    dims, depths, heads = [16, 32, 48, 64], [1, 1, 2, 1], [1, 2, 3, 4]
    attn = ('linear', ) * 4
    torch.manual_seed(3)
    model = ref.randomize_(ref.AuthorsPolaFormerPP(dims, depths, heads, projection=96, num_classes=10,
                                                   attn_types=attn)).eval()
    new_sd, report = convert_official_state_dict(model.state_dict())
    assert report.ok, report.problems()
    arch = report.arch
    assert arch['name'] == 'custom' and arch['attn_types'] == list(attn)
    assert (arch['embed_dims'], arch['depths'], arch['num_heads']) == (dims, depths, heads)
    assert (arch['cls_proj_channels'], arch['num_classes']) == (96, 10)
    ours = ref.project_classifier(dict(embed_dims=dims, depths=depths, num_heads=heads,
                                       cls_proj_channels=96), 10, attn_types=attn)
    ours.load_state_dict(new_sd, strict=True)
    ref.assert_same_logits(ours, model, sizes=((2, 40, 56), ))
