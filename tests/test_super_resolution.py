"""Lightweight super-resolution (polaformerpp.restoration): network, imresize, metrics, data, e2e.

Reference values are derived by hand in the comments (imresize weights, PSNR,
SSIM of constant images) or computed by independent loop implementations.
"""
import json
import math
import os
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.config import Config

from conftest import REPO_ROOT, run_tool

import polaformerpp.restoration as sr
from polaformerpp.restoration import (PSNR, SSIM, PairedImageDataset, PolaPPSRLight,
                                      SRBenchmarkDataset, SRRestorer, imresize, psnr, rgb_to_y,
                                      ssim)
from polaformerpp.restoration.resize import resize_weights
from polaformerpp.restoration.transforms import (PackSRInputs, PairedFlipRot, PairedRandomCrop,
                                                 read_rgb, write_rgb)
from polaformerpp.restoration.window_attention import ShiftedWindowAttention

SR_CONFIGS = {s: osp.join(REPO_ROOT, 'configs', 'super_resolution',
                          f'polapp-srlight_x{s}_2xb16-500k_div2k-64.py') for s in (2, 3, 4)}
TINY_NET = dict(embed_dims=24, depths=(2, ), num_heads=2, window_size=8)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Run these small-op workloads on one thread (restored afterwards).

    The network is many small ops: a second thread gains little, and on a
    machine busy with other work OpenMP barriers make it 10-20x slower.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def tiny_net(upscale=2, **kwargs):
    return PolaPPSRLight(upscale=upscale, **{**TINY_NET, **kwargs})


# ---------------------------------------------------------------- network

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


# ---------------------------------------------------------------- imresize

def test_imresize_hand_derived_weights():
    # 4 -> 2 pixels (scale 1/2): kernel h(x) = k(x/2)/2 spans 8 pixels.
    # Output 1 samples u = 1/0.5 + 0.5(1 - 2) = 1.5; taps j = -2..5 at distances
    # 3.5 .. -3.5, k(1.75) = -3/128, k(1.25) = -9/128, k(0.75) = 29/128,
    # k(0.25) = 111/128; normalised (sum 256/128) and mirrored (-2->3, -1->2,
    # 0->1, 5->4): weights on x1..x4 = [70, 51, 13, -6] / 128.
    row = np.array([70, 51, 13, -6]) / 128
    x = np.array([[1.0, 2.0, 3.0, 4.0]]).repeat(4, 0)  # constant along the height
    out = imresize(x, 0.5)
    np.testing.assert_allclose(out, [[row @ x[0], row[::-1] @ x[0]]] * 2, atol=1e-12)
    np.testing.assert_allclose(out[0], [187 / 128, 453 / 128], atol=1e-12)
    np.testing.assert_allclose(resize_weights(4, 2, 0.5), [row, row[::-1]], atol=1e-12)


def test_imresize_matches_published_matlab_bilinear_outputs():
    # MATLAB outputs quoted in a Q&A comparing imresize with OpenCV: the same
    # coordinate mapping, kernel stretching (antialiasing) and border mirroring
    # as bicubic, with the triangle kernel.
    #   imresize([1,2;3,4],[4,4],'bilinear'), then imresize(ans,[2,2],'bilinear')
    up = imresize(np.array([[1.0, 2.0], [3.0, 4.0]]), size=(4, 4), method='bilinear')
    np.testing.assert_allclose(up, [[1.00, 1.25, 1.75, 2.00], [1.50, 1.75, 2.25, 2.50],
                                    [2.50, 2.75, 3.25, 3.50], [3.00, 3.25, 3.75, 4.00]], atol=1e-12)
    np.testing.assert_allclose(imresize(up, size=(2, 2), method='bilinear'),
                               [[1.5625, 2.1875], [2.8125, 3.4375]], atol=1e-12)


def test_imresize_properties():
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (9, 12, 3), dtype=np.uint8)
    np.testing.assert_array_equal(imresize(img, 1.0), img)  # identity at scale 1
    for scale in (1 / 2, 1 / 3, 1 / 4, 2, 3):
        const = np.full((12, 12, 3), 77, np.uint8)
        out = imresize(const, scale)
        assert out.shape == (math.ceil(12 * scale), math.ceil(12 * scale), 3)
        assert np.all(out == 77)
    assert imresize(np.zeros((10, 7)), 1 / 3).shape == (4, 3)  # ceil, 2-D input
    # enlarging reproduces quadratics away from the borders (Keys' kernel is 3rd order)
    ramp = np.arange(20.0)[None, :] ** 2 * np.ones((3, 1))
    up = imresize(ramp, 2)
    u = np.arange(1, 41) / 2 + 0.5 * (1 - 1 / 2) - 1  # 0-based source positions
    np.testing.assert_allclose(up[1, 6:-6], u[6:-6] ** 2, atol=1e-9)
    # uint8 output is rounded and clipped
    edge = np.array([[0, 0, 255, 255]] * 4, np.uint8)
    assert imresize(edge, 2).dtype == np.uint8 and imresize(edge.astype(float), 2).min() < 0


def test_imresize_bad_input():
    with pytest.raises(ValueError, match='scale'):
        imresize(np.zeros((4, 4)), -1)
    with pytest.raises(ValueError, match='exactly one'):
        imresize(np.zeros((4, 4)))
    with pytest.raises(ValueError, match='shape'):
        imresize(np.zeros((2, 4, 4, 3)), 0.5)
    with pytest.raises(TypeError, match='uint8 or floating'):
        imresize(np.zeros((4, 4), np.int32), 0.5)
    with pytest.raises(ValueError, match='method'):
        imresize(np.zeros((4, 4)), 0.5, method='lanczos3')


# ---------------------------------------------------------------- metrics

def test_rgb_to_y_bt601():
    img = np.array([[[0, 0, 0], [255, 255, 255], [255, 0, 0], [0, 255, 0], [0, 0, 255]]])
    np.testing.assert_allclose(rgb_to_y(img)[0], [16, 235, 16 + 65.481, 16 + 128.553, 16 + 24.966])


def test_psnr_hand_computed():
    gt = np.full((20, 20, 3), 100, np.uint8)
    pred = np.full((20, 20, 3), 110, np.uint8)
    # Y differs by 10 * (65.481 + 128.553 + 24.966) / 255 = 2190 / 255 everywhere
    expected = 10 * math.log10(255 ** 2 / (2190 / 255) ** 2)
    assert psnr(pred, gt, crop_border=2) == pytest.approx(expected, abs=1e-9)
    assert psnr(pred, gt, 2, test_y_channel=False) == pytest.approx(10 * math.log10(255 ** 2 / 100))
    # differences confined to the border are cropped away
    pred = gt.copy()
    pred[:3] = 0
    pred[:, -3:] = 255
    assert psnr(pred, gt, crop_border=3) == float('inf')
    assert psnr(pred, gt, crop_border=2) < 20


def test_ssim_constant_images_hand_computed():
    # constant images: variances and covariance vanish, SSIM = (2 mx my + C1) / (mx^2 + my^2 + C1)
    c1 = (0.01 * 255) ** 2
    gt = np.full((16, 16, 3), 50, np.uint8)
    pred = np.full((16, 16, 3), 60, np.uint8)
    y_gt, y_pred = 16 + 50 * 219 / 255, 16 + 60 * 219 / 255
    expected = (2 * y_gt * y_pred + c1) / (y_gt ** 2 + y_pred ** 2 + c1)
    assert ssim(pred, gt) == pytest.approx(expected, abs=1e-12)
    assert ssim(gt, gt) == pytest.approx(1.0)


def _ssim_loop_reference(x, y):
    """Wang et al.'s SSIM with explicit 11x11 Gaussian windows at every valid position."""
    a = np.arange(11) - 5
    g = np.exp(-(a[:, None] ** 2 + a[None, :] ** 2) / (2 * 1.5 ** 2))
    g /= g.sum()
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    values = []
    for i in range(x.shape[0] - 10):
        for j in range(x.shape[1] - 10):
            px, py = x[i:i + 11, j:j + 11], y[i:i + 11, j:j + 11]
            mx, my = (g * px).sum(), (g * py).sum()
            vx, vy = (g * (px - mx) ** 2).sum(), (g * (py - my) ** 2).sum()
            cov = (g * (px - mx) * (py - my)).sum()
            values.append((2 * mx * my + c1) * (2 * cov + c2)
                          / ((mx ** 2 + my ** 2 + c1) * (vx + vy + c2)))
    return float(np.mean(values))


def test_ssim_matches_loop_reference():
    rng = np.random.default_rng(1)
    gt = rng.integers(0, 256, (22, 25, 3), dtype=np.uint8)
    pred = np.clip(gt.astype(int) + rng.integers(-40, 41, gt.shape), 0, 255).astype(np.uint8)
    expected = _ssim_loop_reference(rgb_to_y(pred[2:-2, 2:-2]), rgb_to_y(gt[2:-2, 2:-2]))
    assert ssim(pred, gt, crop_border=2) == pytest.approx(expected, abs=1e-10)
    try:  # scikit-image's Gaussian SSIM follows the same (MATLAB) definition
        from skimage.metrics import structural_similarity
    except ImportError:
        return
    ref = structural_similarity(rgb_to_y(pred[2:-2, 2:-2]), rgb_to_y(gt[2:-2, 2:-2]), data_range=255,
                                gaussian_weights=True, sigma=1.5, use_sample_covariance=False)
    assert ssim(pred, gt, crop_border=2) == pytest.approx(ref, abs=1e-6)


def test_metric_classes_use_scale_as_border_and_group_by_dataset():
    gt = torch.full((3, 20, 20), 100, dtype=torch.uint8)
    off = gt + 10
    border = gt.clone()
    border[:, :2] = 0  # only inside a 2-pixel border
    samples = [dict(pred_img=off, gt_img=gt, scale=2, dataset_name='A'),
               dict(pred_img=border, gt_img=gt, scale=2, dataset_name='B'),
               dict(pred_img=gt, gt_img=gt, scale=3, dataset_name='B')]
    metric = PSNR()
    metric.process({}, samples[:1])
    expected = psnr(off.permute(1, 2, 0).numpy(), gt.permute(1, 2, 0).numpy(), crop_border=2)
    assert metric.compute_metrics(metric.results) == {'PSNR': pytest.approx(expected)}
    ssim_metric = SSIM()
    ssim_metric.process({}, samples)
    result = ssim_metric.compute_metrics(ssim_metric.results)
    assert result['B/SSIM'] == pytest.approx(1.0) and result['A/SSIM'] < 1.0
    assert result['SSIM'] == pytest.approx((result['A/SSIM'] + 2) / 3)
    with pytest.raises(ValueError, match='crop_border'):
        PSNR(crop_border=-1)
    with pytest.raises(ValueError, match='one shape'):
        psnr(np.zeros((8, 8, 3)), np.zeros((8, 9, 3)))


# ---------------------------------------------------------------- data

def _write(path, img):
    os.makedirs(osp.dirname(path), exist_ok=True)
    write_rgb(path, img)


def _photo(h, w, seed=0):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    img = (128 + 60 * np.sin(xx / 4.0 + seed))[..., None]
    img = img + (50 * np.cos(yy / 5.0))[..., None] * [1, 0.5, -0.5]
    return np.clip(img + rng.normal(0, 4, img.shape), 0, 255).astype(np.uint8)


def test_div2k_layout_and_size_checks(tmp_path):
    root = str(tmp_path / 'DIV2K')
    for i in range(2):
        hr = _photo(24, 30, i)
        _write(f'{root}/HR/{i:04d}.png', hr)
        _write(f'{root}/LR/X3/{i:04d}x3.png', imresize(hr, 1 / 3))
    ds = PairedImageDataset(data_root=root, gt_dir='HR', lr_dir='LR/X{scale}', scale=3,
                            pipeline=[dict(type='LoadPairedImages'), dict(type='PackSRInputs')])
    assert len(ds) == 2
    sample = ds[1]
    assert sample['inputs'].shape == (3, 8, 10) and sample['inputs'].dtype == torch.uint8
    assert sample['data_samples'].gt_img.shape == (3, 24, 30)
    assert sample['data_samples'].scale == 3 and sample['data_samples'].img_name == '0001'
    assert sample['data_samples'].dataset_name == 'DIV2K'

    # HR not mod-cropped (up to scale - 1 extra pixels) is cropped; larger mismatch is an error
    _write(f'{root}/HR/0000.png', _photo(26, 32))
    assert ds[0]['data_samples'].gt_img.shape == (3, 24, 30)
    _write(f'{root}/HR/0000.png', _photo(27, 30))
    with pytest.raises(ValueError, match='LR/HR size mismatch'):
        ds[0]
    _write(f'{root}/HR/0002.png', _photo(24, 30))
    with pytest.raises(FileNotFoundError, match='no LR image 0002x3'):
        PairedImageDataset(data_root=root, gt_dir='HR', lr_dir='LR/X{scale}', scale=3)


def test_benchmark_layouts_and_grayscale(tmp_path):
    root = str(tmp_path / 'benchmark')
    hr = _photo(24, 36)
    _write(f'{root}/Set5/HR/baby.png', hr)  # EDSR layout
    _write(f'{root}/Set5/LR_bicubic/X2/babyx2.png', imresize(hr, 1 / 2))
    _write(f'{root}/Set14/GTmod12/zebra.png', hr)  # BasicSR layout
    _write(f'{root}/Set14/LRbicx2/zebra.png', imresize(hr, 1 / 2))
    os.makedirs(f'{root}/B100', exist_ok=True)  # HR only, grayscale, not mod-cropped
    from PIL import Image
    Image.fromarray(hr[:, :, 0][:23, :35]).save(f'{root}/B100/gray.png')

    pipeline = [dict(type='LoadPairedImages'), dict(type='PackSRInputs')]
    edsr = SRBenchmarkDataset('Set5', 2, data_root=root, pipeline=pipeline)
    basicsr = SRBenchmarkDataset('Set14', 2, data_root=root, pipeline=pipeline)
    hr_only = SRBenchmarkDataset('B100', 2, data_root=root, pipeline=pipeline)
    assert edsr.get_data_info(0)['lr_path'].endswith('LR_bicubic/X2/babyx2.png')
    assert basicsr.get_data_info(0)['lr_path'].endswith('LRbicx2/zebra.png')
    assert hr_only.get_data_info(0)['lr_path'] is None
    for ds in (edsr, basicsr):
        torch.testing.assert_close(ds[0]['inputs'], torch.from_numpy(imresize(hr, 0.5)).permute(2, 0, 1))
    gray = hr_only[0]
    # grayscale -> RGB by replication; mod-cropped to 22 x 34, LR made with imresize
    gt = gray['data_samples'].gt_img
    assert gt.shape == (3, 22, 34) and torch.equal(gt[0], gt[1]) and torch.equal(gt[0], gt[2])
    assert gray['inputs'].shape == (3, 11, 17)
    assert gray['data_samples'].dataset_name == 'B100'

    from mmengine.registry import DATASETS
    concat = DATASETS.build(dict(type='ConcatDataset', datasets=[
        dict(type='SRBenchmarkDataset', name=n, scale=2, data_root=root, pipeline=pipeline)
        for n in ('Set5', 'Set14', 'B100')]))
    assert len(concat) == 3
    with pytest.raises(FileNotFoundError, match='no SR test set layout'):
        SRBenchmarkDataset('Urban100', 2, data_root=root)
    with pytest.raises(FileNotFoundError, match='no SR test set layout'):
        SRBenchmarkDataset('Set5', 2, data_root=root, layout='basicsr')
    with pytest.raises(ValueError, match='layout'):
        SRBenchmarkDataset('Set5', 2, data_root=root, layout='matlab')


def test_paired_crop_and_flips_keep_lr_hr_aligned():
    np.random.seed(0)
    lr = np.random.randint(0, 256, (20, 23, 3), dtype=np.uint8)
    gt = lr.repeat(3, 0).repeat(3, 1)  # each LR pixel is a 3x3 HR block
    for _ in range(20):
        results = dict(lr=lr, gt=gt, scale=3)
        results = PairedFlipRot()(PairedRandomCrop(8)(results))
        assert results['lr'].shape == (8, 8, 3) and results['gt'].shape == (24, 24, 3)
        np.testing.assert_array_equal(results['gt'][::3, ::3], results['lr'])
    packed = PackSRInputs()(dict(results, img_name='x', dataset_name='d'))
    assert packed['inputs'].shape == (3, 8, 8) and packed['data_samples'].gt_img.shape == (3, 24, 24)
    with pytest.raises(ValueError, match='smaller than lr_patch_size'):
        PairedRandomCrop(32)(dict(lr=lr, gt=gt, scale=3))


def test_read_rgb_converts_grayscale_and_drops_alpha(tmp_path):
    from PIL import Image
    gray = np.arange(64, dtype=np.uint8).reshape(8, 8)
    Image.fromarray(gray).save(tmp_path / 'g.png')
    rgba = np.dstack([np.full((8, 8, 3), 9, np.uint8), np.zeros((8, 8), np.uint8)])
    Image.fromarray(rgba).save(tmp_path / 'a.png')
    assert np.array_equal(read_rgb(str(tmp_path / 'g.png')), np.dstack([gray] * 3))
    assert np.array_equal(read_rgb(str(tmp_path / 'a.png')), np.full((8, 8, 3), 9, np.uint8))


# ---------------------------------------------------------------- model wrapper

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
    from mmengine.registry import (DATASETS, HOOKS, METRICS, MODELS, TRANSFORMS, DefaultScope,
                                   Registry)
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


def test_save_hook_writes_png(tmp_path):
    from mmengine.structures import BaseDataElement
    img = torch.randint(0, 256, (3, 5, 7), dtype=torch.uint8)
    out = BaseDataElement(pred_img=img, metainfo=dict(img_name='bird', dataset_name='Set5'))
    sr.SaveSRImagesHook(save_dir=str(tmp_path), suffix='_x2').after_test_iter(None, 0, None, [out])
    saved = read_rgb(str(tmp_path / 'Set5' / 'bird_x2.png'))
    np.testing.assert_array_equal(saved, img.permute(1, 2, 0).numpy())
    sr.SaveSRImagesHook(save_dir=None).after_test_iter(None, 0, None, [out])  # disabled: no-op


@pytest.mark.parametrize('scale', [2, 3, 4])
def test_configs_build_for_their_scale(scale):
    cfg = Config.fromfile(SR_CONFIGS[scale])
    assert cfg.default_scope is None
    assert cfg.custom_imports.imports == ['polaformerpp.restoration']
    from mmengine.registry import MODELS
    model = MODELS.build(cfg.model)
    assert model.network.upscale == scale
    assert cfg.train_dataloader.dataset.scale == scale and cfg.val_dataloader.dataset.scale == scale
    assert [d.scale for d in cfg.test_dataloader.dataset.datasets] == [scale] * 5
    assert [d.name for d in cfg.test_dataloader.dataset.datasets] == ['Set5', 'Set14', 'B100',
                                                                      'Urban100', 'Manga109']
    assert cfg.train_pipeline[1].lr_patch_size == 64
    assert cfg.optim_wrapper.optimizer == dict(type='Adam', lr=2e-4, betas=(0.9, 0.99), weight_decay=0)
    assert cfg.param_scheduler[0].milestones == [250000, 400000, 450000, 475000]
    assert cfg.param_scheduler[0].gamma == 0.5 and cfg.train_cfg.max_iters == 500000
    assert 2 * cfg.train_dataloader.batch_size == cfg.auto_scale_lr.base_batch_size
    assert osp.basename(SR_CONFIGS[scale]).startswith(
        f'polapp-srlight_x{scale}_2xb{cfg.train_dataloader.batch_size}-500k_div2k-64')


# ---------------------------------------------------------------- end to end (slow)

E2E_CONFIG = """
_base_ = [{base!r}]
model = dict(network=dict(embed_dims=24, depths=(2, ), num_heads=2, window_size=8))
train_pipeline = [
    dict(type='LoadPairedImages'),
    dict(type='PairedRandomCrop', lr_patch_size=24),
    dict(type='PairedFlipRot'),
    dict(type='PackSRInputs'),
]
train_dataloader = dict(
    batch_size=8, num_workers=0, persistent_workers=False,
    dataset=dict(data_root={train_root!r}, gt_dir='train_HR', lr_dir='train_LR_bicubic/X{{scale}}',
                 pipeline=train_pipeline))
val_dataloader = dict(num_workers=0, dataset=dict(name='photos', data_root={test_root!r}))
test_dataloader = dict(
    num_workers=0,
    dataset=dict(_delete_=True, type='SRBenchmarkDataset', name='photos', scale=2,
                 data_root={test_root!r}, pipeline=_base_.test_pipeline))
optim_wrapper = dict(optimizer=dict(lr=2e-3))
param_scheduler = [dict(type='MultiStepLR', by_epoch=False, milestones=[{milestone}], gamma=0.25)]
train_cfg = dict(max_iters={iters}, val_interval={iters})
default_hooks = dict(logger=dict(interval=50), checkpoint=dict(interval={iters}, max_keep_ckpts=1))
randomness = dict(seed=0)
"""


def _skimage_photos():
    data = pytest.importorskip('skimage.data', reason='scikit-image provides the test photographs')
    photos = {}
    for name in ('astronaut', 'chelsea', 'coffee', 'rocket', 'immunohistochemistry',
                 'hubble_deep_field'):
        try:
            img = np.asarray(getattr(data, name)())
        except Exception:  # an image scikit-image would have to download
            continue
        if img.ndim == 3 and img.shape[2] >= 3 and img.dtype == np.uint8:
            photos[name] = img[..., :3]
    if len(photos) < 4:
        pytest.skip(f'too few bundled skimage photographs: {sorted(photos)}')
    return photos


@pytest.mark.slow
def test_e2e_x2_train_test_beats_bicubic(tmp_path):
    """Train a reduced network briefly at x2 through tools/train.py; tools/test.py beats bicubic."""
    photos = _skimage_photos()
    names = sorted(photos)
    test_names = [n for n in ('chelsea', 'coffee') if n in photos] or names[-2:]
    train_names = [n for n in names if n not in test_names]
    train_root, test_root = str(tmp_path / 'DIV2K'), str(tmp_path / 'benchmark')
    rng = np.random.default_rng(0)
    count = 0
    for name in train_names:  # DIV2K layout: HR crops and their bicubic x2 LR files
        img = photos[name]
        for _ in range(6):
            top = rng.integers(0, img.shape[0] - 160 + 1)
            left = rng.integers(0, img.shape[1] - 160 + 1)
            hr = img[top:top + 160, left:left + 160]
            _write(f'{train_root}/train_HR/{count:04d}.png', hr)
            _write(f'{train_root}/train_LR_bicubic/X2/{count:04d}x2.png', imresize(hr, 0.5))
            count += 1
    for name in test_names:  # held-out photos, HR only (LR made on the fly), odd sizes
        img = photos[name]
        cy, cx = img.shape[0] // 2, img.shape[1] // 2
        _write(f'{test_root}/photos/HR/{name}.png', img[cy - 75:cy + 76, cx - 99:cx + 100])

    iters = 600  # about 1 minute of one CPU core
    cfg_path = tmp_path / 'e2e_sr_x2.py'
    cfg_path.write_text(E2E_CONFIG.format(base=SR_CONFIGS[2], train_root=train_root,
                                          test_root=test_root, iters=iters,
                                          milestone=int(iters * 0.8)))
    work_dir = str(tmp_path / 'work')
    # one thread: small ops do not gain from two, and a busy machine makes them much slower
    env = dict(OMP_NUM_THREADS='1')
    run_tool(['tools/train.py', str(cfg_path), '--work-dir', work_dir], env=env)
    ckpt = osp.join(work_dir, f'iter_{iters}.pth')
    assert osp.isfile(ckpt)

    save_dir, metrics_file = str(tmp_path / 'sr_png'), str(tmp_path / 'metrics.json')
    run_tool(['tools/test.py', str(cfg_path), ckpt, '--work-dir', work_dir, '--out-json',
              metrics_file, '--cfg-options', f'default_hooks.save_sr.save_dir={save_dir}'], env=env)
    with open(metrics_file) as f:
        metrics = json.load(f)

    bicubic, saved = [], []
    for name in test_names:
        hr = read_rgb(f'{test_root}/photos/HR/{name}.png')[:150, :198]  # mod-crop 2
        lr = imresize(hr, 0.5)
        bicubic.append(psnr(imresize(lr, 2.0), hr, crop_border=2))
        out = read_rgb(osp.join(save_dir, 'photos', f'{name}.png'))
        assert out.shape == hr.shape
        saved.append(psnr(out, hr, crop_border=2))
    model_psnr, bicubic_psnr = metrics['PSNR'], float(np.mean(bicubic))
    assert model_psnr == pytest.approx(float(np.mean(saved)), abs=1e-6)  # PNGs are what was scored
    assert 0 < metrics['SSIM'] < 1
    print(f'x2 PSNR-Y on held-out photos: model {model_psnr:.3f} dB, bicubic {bicubic_psnr:.3f} dB')
    assert model_psnr > bicubic_psnr, (model_psnr, bicubic_psnr)
