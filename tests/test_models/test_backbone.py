"""PolaFormerPP backbone: arch zoo, parameter counts, shapes, freezing, registries, errors."""
import pytest
import torch
import torch.nn as nn

from polaformerpp.models import PolaFormerPP

# The published parameter counts of the authors' classifiers (1000 classes).
AUTHORS_PARAMS = dict(b0=7_548_712, b1=9_227_496, b2=16_450_664, b3=27_145_896, b4=49_798_792,
                      b5=97_773_000)

TINY = dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 4])


def num_params(module):
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize('arch', sorted(AUTHORS_PARAMS))
def test_backbone_plus_classifier_params_equal_authors(arch):
    backbone = PolaFormerPP(arch=arch)
    proj_channels = backbone.num_features[-1]
    classifier = proj_channels * 1000 + 1000
    assert num_params(backbone) + classifier == AUTHORS_PARAMS[arch]


def test_dense_outputs_at_odd_size():
    model = PolaFormerPP('b0', out_indices=(0, 1, 2, 3, 4)).eval()
    model.init_weights()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 225, 161))
    # every stride-2 conv pads by 1: sizes round up
    expected = [(32, 57, 41), (64, 29, 21), (128, 15, 11), (384, 8, 6), (2048, 8, 6)]
    assert [tuple(o.shape[1:]) for o in outs] == expected
    assert all(torch.isfinite(o).all() for o in outs)


@pytest.mark.parametrize('attn_types', [('linear', ) * 4, ('softmax', ) * 4,
                                        ('linear', 'softmax', 'linear', 'softmax')])
def test_any_attention_combination(attn_types):
    model = PolaFormerPP(TINY, out_indices=(0, 1, 2, 3), attn_types=attn_types)
    outs = model(torch.randn(2, 3, 37, 50))
    sum(o.sum() for o in outs).backward()
    assert [o.shape[1] for o in outs] == TINY['embed_dims']
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_stage_attention_types_follow_config():
    from polaformerpp.models.layers import PolaLinearAttention, RoPESoftmaxAttention

    for fused in (False, True):
        model = PolaFormerPP('b0', fused=fused)
        kinds = [stage.blocks[0].attn for stage in model.stages]
        assert [type(m) is PolaLinearAttention for m in kinds] == [not fused] * 2 + [False] * 2
        assert [isinstance(m, PolaLinearAttention) for m in kinds] == [True, True, False, False]
        assert [isinstance(m, RoPESoftmaxAttention) for m in kinds] == [False, False, True, True]


def test_arch_defaults_drop_path_and_layer_scale():
    b4 = PolaFormerPP('b4')
    assert b4.stages[3].blocks[-1].drop_path.drop_prob == pytest.approx(0.4)
    assert b4.stages[0].blocks[0].gamma1.data.eq(1).all()
    assert b4.stages[2].blocks[0].gamma1.data.eq(1e-6).all()
    b0 = PolaFormerPP('b0', drop_path_rate=0.0, layer_scale_init_values=[0.5] * 4)
    assert b0.stages[3].blocks[-1].drop_path.drop_prob == 0.0
    assert b0.stages[1].blocks[0].gamma2.data.eq(0.5).all()


def test_init_weights_truncated_normal_convs_zero_temperatures():
    model = PolaFormerPP('b0')
    model.init_weights()
    # truncated normal with std 0.02 (bounds +-2 as in timm/mmengine: effectively untruncated)
    conv = model.stages[2].downsample.conv
    assert conv.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert conv.bias.abs().max() == 0
    attn = model.stages[0].blocks[0].attn
    assert attn.temp_same.abs().max() == 0 and attn.temp_opp.abs().max() == 0


def test_frozen_stages_and_norm_eval():
    model = PolaFormerPP(TINY, out_indices=(0, 1, 2, 3), frozen_stages=2, norm_eval=True)
    model.train()
    assert not any(p.requires_grad for p in model.stem.parameters())
    assert not any(p.requires_grad for p in model.stages[1].parameters())
    assert not any(p.requires_grad for p in model.norm1.parameters())
    assert all(p.requires_grad for p in model.stages[2].parameters())
    assert all(not m.training for m in model.modules() if isinstance(m, nn.BatchNorm2d))
    bn = model.stages[2].downsample.bn
    before = bn.running_mean.clone()
    model(torch.randn(2, 3, 64, 64))
    torch.testing.assert_close(bn.running_mean, before)
    assert model.stages[2].blocks[0].training  # only BN is put in eval mode


def test_with_cp_matches_plain_forward():
    torch.manual_seed(0)
    plain = PolaFormerPP(TINY, out_indices=(3, ))
    ckpt = PolaFormerPP(TINY, out_indices=(3, ), with_cp=True)
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(1, 3, 40, 40, requires_grad=True)
    torch.testing.assert_close(plain(x)[0], ckpt(x)[0])


@pytest.mark.parametrize('kwargs, words', [
    (dict(arch='b9'), "arch must be one of"),
    (dict(arch=dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1])), 'missing'),
    (dict(arch=dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1], num_heads=[1, 2, 2, 4])),
     "arch['depths'] must have 4 entries"),
    (dict(arch=dict(embed_dims=[16, 32, 50, 64], depths=[1] * 4, num_heads=[1, 2, 4, 4])),
     'divisible'),
    (dict(arch=TINY, attn_types=('linear', 'flash', 'softmax', 'softmax')), 'attn_types'),
    (dict(arch=TINY, out_indices=(5, )), 'out_indices'),
    (dict(arch=TINY, frozen_stages=7), 'frozen_stages'),
])
def test_bad_arguments_raise(kwargs, words):
    with pytest.raises(ValueError) as info:
        PolaFormerPP(**kwargs)
    assert words in str(info.value)


def test_wrong_input_channels_raise():
    model = PolaFormerPP(TINY)
    with pytest.raises(ValueError, match=r'expects input of shape \(B, 3, H, W\)'):
        model(torch.randn(1, 4, 32, 32))


def test_softmax_stage_needs_head_dim_multiple_of_4():
    with pytest.raises(ValueError, match='multiple of 4'):
        PolaFormerPP(dict(embed_dims=[16, 32, 48, 60], depths=[1] * 4, num_heads=[1, 2, 2, 10]))


@pytest.mark.parametrize('scope', ['mmpretrain', 'mmdet', 'mmseg'])
def test_builds_from_every_library_scope(scope):
    import importlib

    from mmengine.registry import DefaultScope, init_default_scope
    registry = importlib.import_module(f'{scope}.registry').MODELS
    importlib.import_module('polaformerpp')
    init_default_scope(scope)
    with DefaultScope.overwrite_default_scope(scope):
        model = registry.build(dict(type='PolaFormerPP', arch=TINY, out_indices=(0, 1, 2, 3)))
    assert isinstance(model, PolaFormerPP)


def test_fused_and_plain_backbones_agree_and_share_keys():
    """``fused=True`` (the default) and ``fused=False`` build the same module tree and parameter names;
    with the same weights their outputs agree in inference and training, gradients included, and
    unfusing gives the plain modules back."""
    from polaformerpp.ops.fusion import is_fused, unfuse_modules

    torch.manual_seed(0)
    kwargs = dict(arch=TINY, out_indices=(0, 3, 4), drop_path_rate=0.0)
    fused, plain = PolaFormerPP(**kwargs), PolaFormerPP(fused=False, **kwargs)
    assert [n for n, _ in fused.named_modules()] == [n for n, _ in plain.named_modules()]
    assert list(fused.state_dict()) == list(plain.state_dict())
    assert any(is_fused(m) for m in fused.modules()) and not any(is_fused(m) for m in plain.modules())
    plain.load_state_dict(fused.state_dict())
    x = torch.randn(2, 3, 36, 44)
    fused.eval(), plain.eval()
    with torch.no_grad():
        for a, b in zip(fused(x), plain(x)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    fused.train(), plain.train()
    grads = []
    for model in (fused, plain):
        outs = model(x)
        sum(o.square().mean() for o in outs).backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], rtol=1e-4, atol=1e-4, msg=name)
    unfuse_modules(fused)
    assert not any(is_fused(m) for m in fused.modules())


def test_hooks_on_every_module_fire_in_the_fused_backbone():
    """The tree a user hooks is the tree that runs: forward hooks on the LePE convs and the
    classification projection fire (the fused forms step aside for hooked modules)."""
    torch.manual_seed(0)
    model = PolaFormerPP(TINY, out_indices=(4, )).eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)[0]
    watched = [model.cls_proj, model.cls_proj.conv, model.stem[0].conv, model.stages[0].blocks[0].attn.lepe,
               model.stages[3].blocks[0].attn.lepe]
    seen = []
    handles = [m.register_forward_hook(lambda m, args, out: seen.append(m)) for m in watched]
    try:
        with torch.no_grad():
            torch.testing.assert_close(model(x)[0], expected, rtol=1e-5, atol=1e-5)
    finally:
        for handle in handles:
            handle.remove()
    assert sorted(map(id, seen)) == sorted(map(id, watched))
