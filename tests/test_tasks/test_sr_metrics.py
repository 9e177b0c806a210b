"""MATLAB-style imresize, BT.601 Y, PSNR and SSIM (functions and metric classes).

Reference values are derived by hand in the comments (imresize weights, PSNR,
SSIM of constant images) or computed by independent loop implementations."""
import math

import numpy as np
import pytest
import torch

from polaformerpp.restoration import PSNR, SSIM, imresize, psnr, rgb_to_y, ssim
from polaformerpp.restoration.resize import resize_weights
from sr_testing import one_torch_thread  # noqa: F401 (fixtures)


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
