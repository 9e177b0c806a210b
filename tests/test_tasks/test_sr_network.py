"""Lightweight super-resolution network (polaformerpp.restoration): parameter count,
model-zoo files, output sizes, the global PolaFormer++ branch, shifted-window
attention against a loop, the restorer's loss/predict, registration, and an x3
checkpoint initialising x2."""
import math
import os.path as osp

import pytest
import torch
import torch.nn.functional as F

from conftest import REPO_ROOT
from polaformerpp.restoration import PolaPPSRLight, SRRestorer
from polaformerpp.restoration.window_attention import ShiftedWindowAttention
from sr_testing import (
    SR_CONFIGS,
    one_torch_thread,  # noqa: F401 (fixtures)
)

TINY_NET = dict(embed_dims=24, depths=(2, ), num_heads=2, window_size=8)


def tiny_net(upscale=2, **kwargs):
    return PolaPPSRLight(upscale=upscale, **{**TINY_NET, **kwargs})


def test_param_count_x3_matches_paper():
    n_params = sum(p.numel() for p in PolaPPSRLight(upscale=3).parameters())
    assert n_params == 930_347
    assert abs(n_params - 0.93e6) <= 0.1 * 0.93e6
    # only the upsampler's conv depends on the scale: 48 * 3 s^2 * 9 + 3 s^2
    for s, expected in ((2, 923_852), (4, 939_440)):
        assert sum(p.numel() for p in PolaPPSRLight(upscale=s).parameters()) == expected


def test_model_zoo_files_match_the_code():
    import yaml
    folder = osp.join(REPO_ROOT, 'configs', 'super_resolution')
    with open(osp.join(folder, 'metafile.yml')) as f:
        models = yaml.safe_load(f)['Models']
    assert {m['Config'] for m in models} == {osp.relpath(p, REPO_ROOT) for p in SR_CONFIGS.values()}
    params = {2: 923_852, 3: 930_347, 4: 939_440}
    readme = open(osp.join(folder, 'README.md')).read()
    for m in models:
        assert m['Metadata']['Parameters'] == params[m['Metadata']['Scale']]
        assert f"{params[m['Metadata']['Scale']]:,}" in readme
    x3 = next(m for m in models if m['Metadata']['Scale'] == 3)
    assert {r['Dataset']: r['Metrics']['PSNR'] for r in x3['Results']} == {
        'Set5': 34.79, 'Set14': 30.72, 'B100': 29.31, 'Urban100': 29.11, 'Manga109': 34.54}


def test_forward_odd_size_gives_exact_output_size():
    torch.manual_seed(0)
    net = PolaPPSRLight(upscale=3).eval()  # full network, window 16 padded on 37 x 53
    with torch.no_grad():
        assert net(torch.rand(1, 3, 37, 53)).shape == (1, 3, 111, 159)
        for s in (2, 4):
            assert tiny_net(s).eval()(torch.rand(2, 3, 37, 53)).shape == (2, 3, 37 * s, 53 * s)
        assert tiny_net(2)(torch.rand(1, 3, 1, 1)).shape == (1, 3, 2, 2)


def test_global_branch_is_the_projects_polaformerpp_attention():
    from polaformerpp.models.layers import PolaLinearAttention
    net = PolaPPSRLight(upscale=3)
    layer = net.groups[0].layers[1]
    attn = layer.global_attn.attn
    assert isinstance(attn, PolaLinearAttention)
    assert (attn.num_heads, attn.head_dim, attn.use_rope) == (4, 12, True)
    assert attn.lepe.kernel_size == (5, 5)
    assert layer.window_attn.shift_size == 8 and net.groups[0].layers[0].window_attn.shift_size == 0
    assert layer.window_attn.relative_position_bias_table.shape == (31 * 31, 4)
    assert torch.all(layer.scale1 == 1e-4)


def test_fused_and_plain_networks_agree():
    """``fused=True`` (the default) and ``fused=False``: the same keys, and with the same weights the same
    output in inference and the same gradients in training."""
    torch.manual_seed(0)
    fused, plain = tiny_net(), tiny_net(fused=False)
    assert list(fused.state_dict()) == list(plain.state_dict())
    plain.load_state_dict(fused.state_dict())
    x = torch.rand(1, 3, 12, 10)
    for model in (fused, plain):
        model(x).square().mean().backward()
    for (name, a), b in zip(fused.named_parameters(), plain.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)
    fused.eval(), plain.eval()
    with torch.no_grad():
        torch.testing.assert_close(fused(x), plain(x), rtol=1e-5, atol=1e-5)


def _window_attention_loop_reference(m, x):
    """Per-token loop: each query attends to the real tokens of its (shifted) window and region."""
    B, H, W, C = x.shape
    w, s, h = m.window_size, m.shift_size, m.num_heads
    d = C // h
    q, k, v = m.qkv(x).split(C, dim=-1)
    Hp, Wp = math.ceil(H / w) * w, math.ceil(W / w) * w

    def where(r, c):  # window and position inside it, after rolling by -s
        rr, cc = (r - s) % Hp, (c - s) % Wp
        return (rr // w, cc // w), (rr % w, cc % w)

    out = torch.zeros(B, H, W, C)
    table = m.relative_position_bias_table
    for i in range(H):
        for j in range(W):
            win, (pi, pj) = where(i, j)
            keys = [(a, b) for a in range(H) for b in range(W)
                    if where(a, b)[0] == win and (a < s, b < s) == (i < s, j < s)]
            for head in range(h):
                sl = slice(head * d, (head + 1) * d)
                logits = []
                for a, b in keys:
                    ka, kb = where(a, b)[1]
                    bias = table[(pi - ka + w - 1) * (2 * w - 1) + (pj - kb + w - 1), head]
                    logits.append((q[:, i, j, sl] * k[:, a, b, sl]).sum(-1) / math.sqrt(d) + bias)
                p = torch.stack(logits, -1).softmax(-1)
                out[:, i, j, sl] = sum(p[:, t, None] * v[:, a, b, sl] for t, (a, b) in enumerate(keys))
    return m.proj(out)


@pytest.mark.parametrize('H,W,shift', [(8, 8, 0), (8, 8, 2), (7, 10, 0), (7, 10, 2), (3, 5, 2)])
def test_window_attention_pads_shifts_and_masks_like_a_loop(H, W, shift):
    torch.manual_seed(0)
    m = ShiftedWindowAttention(8, 2, window_size=4, shift_size=shift)
    torch.nn.init.normal_(m.relative_position_bias_table, std=1.0)
    x = torch.randn(2, H, W, 8)
    with torch.no_grad():
        torch.testing.assert_close(m(x), _window_attention_loop_reference(m, x), atol=1e-5, rtol=1e-5)


def _batch(scale=2, lr_size=(8, 10), n=2):
    from mmengine.structures import BaseDataElement
    torch.manual_seed(0)
    inputs = [torch.randint(0, 256, (3, *lr_size), dtype=torch.uint8) for _ in range(n)]
    samples = [BaseDataElement(gt_img=torch.randint(0, 256, (3, lr_size[0] * scale, lr_size[1] * scale),
                                                    dtype=torch.uint8),
                               metainfo=dict(scale=scale, img_name=f'im{i}', dataset_name='toy'))
               for i in range(n)]
    return dict(inputs=inputs, data_samples=samples)


def test_restorer_loss_predict_and_bad_inputs():
    model = SRRestorer(network=dict(type='PolaPPSRLight', upscale=2, **TINY_NET))
    data = model.data_preprocessor(_batch(), training=True)
    mean = torch.tensor([0.4488, 0.4371, 0.4040]).view(1, 3, 1, 1)
    expected = torch.stack(_batch()['inputs']).float() / 255 - mean
    torch.testing.assert_close(data['inputs'], expected)
    losses = model(**data, mode='loss')
    assert set(losses) == {'loss'} and losses['loss'].requires_grad
    losses['loss'].backward()

    optim = torch.optim.Adam(model.parameters(), lr=1e-3)
    from mmengine.optim import OptimWrapper
    log_vars = model.train_step(_batch(), OptimWrapper(optim))
    assert 'loss' in log_vars
    preds = model.val_step(_batch())
    assert preds[0].pred_img.dtype == torch.uint8 and preds[0].pred_img.shape == (3, 16, 20)

    with pytest.raises(ValueError, match='upscale=2'):
        model.val_step(_batch(scale=3))  # a scale the network was not built for
    bad = _batch()
    bad['inputs'][1] = bad['inputs'][1][:, :7]
    with pytest.raises(ValueError, match='batch_size=1'):
        model.val_step(bad)
    gray = _batch()
    gray['inputs'] = [t[:1] for t in gray['inputs']]
    with pytest.raises(ValueError, match=r'\(B, 3, h, w\)'):
        model.val_step(gray)
    with pytest.raises(ValueError, match='grayscale'):
        model.network(torch.rand(1, 1, 8, 8))
    with pytest.raises(ValueError, match='upscale'):
        PolaPPSRLight(upscale=0)


def test_registered_and_buildable_under_any_scope():
    from mmengine.registry import DATASETS, HOOKS, METRICS, MODELS, TRANSFORMS, DefaultScope, Registry
    for registry, names in ((MODELS, ('PolaPPSRLight', 'SRRestorer', 'SRDataPreprocessor')),
                            (DATASETS, ('PairedImageDataset', 'SRBenchmarkDataset')),
                            (TRANSFORMS, ('LoadPairedImages', 'PairedRandomCrop', 'PairedFlipRot',
                                          'PackSRInputs')),
                            (METRICS, ('PSNR', 'SSIM')), (HOOKS, ('SaveSRImagesHook', ))):
        for name in names:
            assert registry.get(name) is not None, name
    child = Registry('model', parent=MODELS, scope='polapp_sr_custom_scope')
    with DefaultScope.overwrite_default_scope('polapp_sr_custom_scope'):
        net = child.build(dict(type='PolaPPSRLight', upscale=4, **TINY_NET))
    assert isinstance(net, PolaPPSRLight) and net.upscale == 4


def test_x3_checkpoint_initialises_x2_except_upsampler(tmp_path):
    from mmengine.runner import load_checkpoint
    x3, x2 = tiny_net(3), tiny_net(2)
    state_dict = {f'network.{k}': v for k, v in x3.state_dict().items()}
    torch.save({'state_dict': state_dict}, tmp_path / 'x3.pth')
    model = SRRestorer(network=x2)
    before = model.network.upsample[0].weight.clone()
    load_checkpoint(model, str(tmp_path / 'x3.pth'), strict=False)  # what Runner's load_from does
    for name, value in x3.state_dict().items():
        if name.startswith('upsample.'):
            continue
        torch.testing.assert_close(model.network.state_dict()[name], value)
    torch.testing.assert_close(model.network.upsample[0].weight, before)


# --------------------------------------------------------------- padding and tiled inference
def test_tile_boxes_follow_the_release_partition():
    """n = size // 200 + 1 parts of padded // n, padded = next multiple of n, shave = part // 10."""
    from polaformerpp.restoration.model import tile_boxes
    assert tile_boxes(150) == (150, [(0, 150, 0)])
    assert tile_boxes(450) == (450, [(0, 165, 0), (135, 315, 15), (285, 450, 15)])
    assert tile_boxes(401) == (402, [(0, 147, 0), (121, 281, 13), (255, 402, 13)])
    assert tile_boxes(205, split_size=100, overlap_div=10) == (207, [(0, 75, 0), (63, 144, 6), (132, 207, 6)])


def test_mirror_pad_is_the_release_flip_concatenation():
    from polaformerpp.restoration.model import mirror_pad
    x = torch.rand(1, 3, 11, 13)
    expected = torch.cat([x, x.flip(2)], 2)[:, :, :16]
    expected = torch.cat([expected, expected.flip(3)], 3)[:, :, :, :16]
    torch.testing.assert_close(mirror_pad(x, 16, 16), expected, rtol=0, atol=0)
    small = torch.rand(1, 1, 3, 2)  # pad larger than the image: the mirroring repeats
    assert mirror_pad(small, 8, 2)[0, 0, :, 0].tolist() == small[0, 0, [0, 1, 2, 2, 1, 0, 0, 1], 0].tolist()


class _LocalNet(torch.nn.Module):
    """Three 3x3 convs and a pixel shuffle: each output pixel sees 3 LR pixels around it."""
    upscale, window_size = 2, 16

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.GELU(),
                                        torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.GELU(),
                                        torch.nn.Conv2d(8, 12, 3, padding=1), torch.nn.PixelShuffle(2))

    def forward(self, x):
        return self.body(x)


@torch.no_grad()
def test_tiled_equals_whole_image_when_the_overlap_covers_the_receptive_field():
    """420 x 230 LR: 3 x 2 parts of 140 x 115, overlaps 14 / 11 >= the receptive radius 3, no padding."""
    torch.manual_seed(0)
    model = SRRestorer(network=_LocalNet(), tile=dict(split_size=200, overlap_div=10)).eval()
    x = torch.rand(2, 3, 420, 230)
    torch.testing.assert_close(model._run_tiled(x), model.network(x), rtol=0, atol=1e-6)


@torch.no_grad()
def test_tiled_prediction_is_the_network_on_each_part():
    """With global attention the parts differ from the whole image; each part's centre is the
    (mirror-padded) network on its reflect-padded crop, as the release's test() assembles it."""
    from polaformerpp.restoration.model import mirror_pad
    torch.manual_seed(0)
    model = SRRestorer(network=tiny_net(2), pad_to_window=True,
                       tile=dict(split_size=100, overlap_div=10)).eval()
    x = torch.rand(1, 3, 205, 37)
    out = model._run_tiled(x)
    assert out.shape == (1, 3, 410, 74)
    padded = F.pad(x, (0, 0, 0, 2), mode='reflect')  # 205 -> 207 = 3 parts of 69, shave 6
    for (top, bottom, dy), row in zip([(0, 75, 0), (63, 144, 6), (132, 207, 6)], range(3)):
        crop = padded[..., top:bottom, :]
        h = bottom - top
        part = model.network(mirror_pad(crop, -(-h // 8) * 8, 40))[..., :2 * h, :74]
        rows = slice(2 * 69 * row, min(2 * 69 * (row + 1), 410))
        torch.testing.assert_close(out[..., rows, :], part[..., 2 * dy:2 * dy + rows.stop - rows.start, :])
    # predict uses the tiles; whole-image inference is the same model without them
    samples = model.val_step(dict(inputs=[(x[0] * 255).round().to(torch.uint8)]))
    assert samples[0].pred_img.shape == (3, 410, 74)
