"""tools/deployment/pytorch2onnx.py: ONNX export checked by onnxruntime, and its errors.

Fast: a tiny classifier (static H, W), the refusals (a checkpoint of another
model, a config of another kind, an opset below the exporter's). Slow: the
tiny classifier with dynamic H, W, the shipped b0 classifier, a b1 dense
backbone and the SR x2 network, each with dynamic H, W, verified at two
sizes. The b0 and b1 networks keep their widths, heads and heads' sizes but
have one block of each attention type, in stages 2 (linear) and 3 (softmax),
and none in stages 1 and 4 (their downsampling and output norms stay): the
blocks of one type are one code path repeated at other widths, and export
time grows with the graph (b0: 12.6 s instead of 19.5 s with a block per stage).
"""
import os.path as osp

import onnx
import pytest
import torch

from conftest import ONE_BLOCK_PER_ATTENTION_TYPE, REPO_ROOT, TWO_BLOCK_ARCH, load_tool
from polaformerpp.utils.checkpoint import exit_on_checkpoint_error
from polaformerpp.utils.cli import run_cli

TOOL = 'tools/deployment/pytorch2onnx.py'
B0 = osp.join(REPO_ROOT, 'configs', 'classification', 'polapp-b0_8xb256_in1k.py')
LIGHTHAM_B1 = osp.join(REPO_ROOT, 'configs', 'segmentation', 'polapp-b1_lightham_8xb8-160k_ade20k-512x512.py')
MASK_RCNN_B2 = osp.join(REPO_ROOT, 'configs', 'detection', 'mask-rcnn_polapp-b2_fpn_8xb2-amp-1x_coco.py')
SR_X2 = osp.join(REPO_ROOT, 'configs', 'super_resolution', 'polapp-srlight_x2_8xb16-500k_div2k-192.py')
DIT = osp.join(REPO_ROOT, 'configs', 'generation', 'dit-tiny-4_polapp_1xb32-2k_demo-shapes-32.py')
#: a linear-attention block (stage 2) and a softmax block (stage 3), two heads each
TINY_ARCH = dict(TWO_BLOCK_ARCH, cls_proj_channels=64)


@pytest.fixture(autouse=True)
def two_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(min(threads, 2))
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope='module')
def tool():
    return load_tool(TOOL)


@pytest.fixture(scope='module')
def tiny_config(tmp_path_factory):
    """The b0 classifier config on a 2-block arch (both attention types), 10 classes."""
    path = tmp_path_factory.mktemp('tiny_onnx') / 'polapp-tiny_cls.py'
    path.write_text(f"_base_ = [{B0!r}]\n"
                    f"model = dict(backbone=dict(arch=dict(_delete_=True, **{TINY_ARCH!r})),\n"
                    f"             head=dict(in_channels={TINY_ARCH['cls_proj_channels']}, num_classes=10))\n")
    return str(path)


def one_block_per_attention_type(config: str, arch: str, folder) -> str:
    """``config`` with its backbone on ``arch``'s widths, heads and projection, one block in stage 2
    (linear attention) and one in stage 3 (softmax attention)."""
    from polaformerpp.models.backbones import PolaFormerPP
    one_block = dict(PolaFormerPP.arch_zoo[arch], depths=ONE_BLOCK_PER_ATTENTION_TYPE)
    path = folder / f'{arch}_one_block_per_attention_type.py'
    path.write_text(f"_base_ = [{config!r}]\n"
                    f"model = dict(backbone=dict(arch=dict(_delete_=True, **{one_block!r})))\n")
    return str(path)


def check_verified(result, names, tolerance=1e-4):
    assert result['max_relative_error'] <= tolerance
    rows = result['verification']
    assert {r['output'] for r in rows} == set(names)
    assert len({r['shape'] for r in rows}) == (2 if result['dynamic'] else 1)
    assert all(0 < r['max_abs_reference'] and r['relative_error'] <= tolerance for r in rows)


def test_tiny_classifier_static_export_runs_in_onnxruntime(tool, tiny_config, tmp_path, capsys):
    out = str(tmp_path / 'tiny.onnx')
    result = tool.main([tiny_config, '--out', out, '--shape', '64', '96', '--verify'])
    check_verified(result, ['logits'])
    assert result['opset'] == 18 and result['inputs'] == {'input': [1, 3, 64, 96]}
    assert result['outputs'] == {'logits': [1, 10]}
    onnx.checker.check_model(onnx.load(out))
    printed = capsys.readouterr().out
    assert 'verified: max relative error' in printed and 'logits' in printed


@pytest.mark.slow  # 10-12 s on a small CPU: past the default set's budget
def test_tiny_classifier_dynamic_export_runs_at_two_sizes(tool, tiny_config, tmp_path):
    out = str(tmp_path / 'tiny_dynamic.onnx')
    result = tool.main([tiny_config, '--out', out, '--shape', '64', '--dynamic', '--verify'])
    check_verified(result, ['logits'])
    assert result['inputs'] == {'input': [1, 3, 'height', 'width']}
    assert sorted(r['shape'] for r in result['verification']) == [(64, 64), (101, 135)]


def test_checkpoint_of_another_model_is_refused_with_the_keys(tool, tiny_config, tmp_path, capsys):
    from polaformerpp.analysis import load_model
    other = load_model(tiny_config, cfg_options={'model.head.num_classes': 7})
    checkpoint = str(tmp_path / 'other.pth')
    torch.save({'state_dict': other.state_dict()}, checkpoint)
    out = str(tmp_path / 'never.onnx')
    with pytest.raises(SystemExit) as info:
        exit_on_checkpoint_error(lambda argv: run_cli(tool.main, argv), [tiny_config, checkpoint, '--out', out])
    err = capsys.readouterr().err
    assert info.value.code == 1
    assert 'does not fit the model' in err and 'head.fc.weight' in err and 'shape mismatch' in err, err
    assert not osp.exists(out)


@pytest.mark.parametrize('argv,name', [
    ([DIT, '--out', 'x.onnx'], 'config'),
    ([B0, '--out', 'x.onnx', '--opset', '17'], '--opset'),
    ([B0, '--out', 'x.onnx', '--shape', '0'], '--shape'),
    ([B0, 'missing.pth', '--out', 'x.onnx'], 'checkpoint'),
    ([B0, '--out', '/no/such/folder/x.onnx'], '--out'),
], ids=['dit-config', 'opset-17', 'shape-0', 'missing-checkpoint', 'missing-folder'])
def test_impossible_arguments_exit_2(tool, argv, name, capsys):
    with pytest.raises(SystemExit) as info:
        run_cli(tool.main, argv, prog='pytorch2onnx.py')
    err = capsys.readouterr().err
    assert info.value.code == 2 and name in err and 'Traceback' not in err, err


# ----------------------------------------------------------------------------- the shipped networks
@pytest.mark.slow
def test_b0_classifier_dynamic_export_verifies(tool, tmp_path):
    config = one_block_per_attention_type(B0, 'b0', tmp_path)
    result = tool.main([config, '--out', str(tmp_path / 'b0.onnx'), '--dynamic', '--verify'])
    check_verified(result, ['logits'])
    assert result['outputs'] == {'logits': [1, 1000]}


@pytest.mark.slow
def test_b1_dense_backbone_dynamic_export_verifies(tool, tmp_path):
    """LightHam's backbone returns stages 2-4; the Mask R-CNN configs' all four (same code path)."""
    config = one_block_per_attention_type(LIGHTHAM_B1, 'b1', tmp_path)
    result = tool.main([config, '--out', str(tmp_path / 'b1.onnx'), '--shape', '256', '320', '--dynamic',
                        '--verify'])
    check_verified(result, ['stride8', 'stride16', 'stride32'])
    assert result['outputs']['stride8'] == [1, 64, '(((height - 1)//8)) + 1', '(((width - 1)//8)) + 1']


@pytest.mark.slow
def test_sr_x2_network_dynamic_export_verifies(tool, tmp_path):
    """The x2 network with 2 attentive layers (a plain and a shifted one; the 20 of the config repeat them)."""
    result = tool.main([SR_X2, '--out', str(tmp_path / 'sr.onnx'), '--shape', '40', '--dynamic', '--verify',
                        '--cfg-options', 'model.network.depths=(2,)'])
    check_verified(result, ['sr'])
    assert result['outputs'] == {'sr': [1, 3, '2*height', '2*width']}
