"""Super-resolution data: DIV2K and benchmark layouts, paired crops and flips, image
reading, the SR image saving hook."""
import os

import numpy as np
import pytest
import torch

import polaformerpp.restoration as sr
from polaformerpp.restoration import PairedImageDataset, SRBenchmarkDataset, imresize
from polaformerpp.restoration.transforms import PackSRInputs, PairedFlipRot, PairedRandomCrop, read_rgb
from sr_testing import (
    one_torch_thread,  # noqa: F401 (fixtures)
    write,
)


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
        write(f'{root}/HR/{i:04d}.png', hr)
        write(f'{root}/LR/X3/{i:04d}x3.png', imresize(hr, 1 / 3))
    ds = PairedImageDataset(data_root=root, gt_dir='HR', lr_dir='LR/X{scale}', scale=3,
                            pipeline=[dict(type='LoadPairedImages'), dict(type='PackSRInputs')])
    assert len(ds) == 2
    sample = ds[1]
    assert sample['inputs'].shape == (3, 8, 10) and sample['inputs'].dtype == torch.uint8
    assert sample['data_samples'].gt_img.shape == (3, 24, 30)
    assert sample['data_samples'].scale == 3 and sample['data_samples'].img_name == '0001'
    assert sample['data_samples'].dataset_name == 'DIV2K'

    # HR not mod-cropped (up to scale - 1 extra pixels) is cropped; larger mismatch is an error
    write(f'{root}/HR/0000.png', _photo(26, 32))
    assert ds[0]['data_samples'].gt_img.shape == (3, 24, 30)
    write(f'{root}/HR/0000.png', _photo(27, 30))
    with pytest.raises(ValueError, match='LR/HR size mismatch'):
        ds[0]
    write(f'{root}/HR/0002.png', _photo(24, 30))
    with pytest.raises(FileNotFoundError, match='no LR image 0002x3'):
        PairedImageDataset(data_root=root, gt_dir='HR', lr_dir='LR/X{scale}', scale=3)


def test_benchmark_layouts_and_grayscale(tmp_path):
    root = str(tmp_path / 'benchmark')
    hr = _photo(24, 36)
    write(f'{root}/Set5/HR/baby.png', hr)  # EDSR layout
    write(f'{root}/Set5/LR_bicubic/X2/babyx2.png', imresize(hr, 1 / 2))
    write(f'{root}/Set14/GTmod12/zebra.png', hr)  # BasicSR layout
    write(f'{root}/Set14/LRbicx2/zebra.png', imresize(hr, 1 / 2))
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
    write(f'{root}/Manga109/HR/Aisazu.png', hr)  # the release's Manga109 names: '{}_LRBI_x2'
    write(f'{root}/Manga109/LR_bicubic/X2/Aisazu_LRBI_x2.png', imresize(hr, 1 / 2))
    manga = SRBenchmarkDataset('Manga109', 2, data_root=root, pipeline=pipeline)
    assert manga.get_data_info(0)['lr_path'].endswith('LR_bicubic/X2/Aisazu_LRBI_x2.png')
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
    with pytest.raises(ValueError, match="smaller than the LR patch"):
        PairedRandomCrop(32)(dict(lr=lr, gt=gt, scale=3))


def test_read_rgb_converts_grayscale_and_drops_alpha(tmp_path):
    from PIL import Image
    gray = np.arange(64, dtype=np.uint8).reshape(8, 8)
    Image.fromarray(gray).save(tmp_path / 'g.png')
    rgba = np.dstack([np.full((8, 8, 3), 9, np.uint8), np.zeros((8, 8), np.uint8)])
    Image.fromarray(rgba).save(tmp_path / 'a.png')
    assert np.array_equal(read_rgb(str(tmp_path / 'g.png')), np.dstack([gray] * 3))
    assert np.array_equal(read_rgb(str(tmp_path / 'a.png')), np.full((8, 8, 3), 9, np.uint8))


def test_save_hook_writes_png(tmp_path):
    from mmengine.structures import BaseDataElement
    img = torch.randint(0, 256, (3, 5, 7), dtype=torch.uint8)
    out = BaseDataElement(pred_img=img, metainfo=dict(img_name='bird', dataset_name='Set5'))
    sr.SaveSRImagesHook(save_dir=str(tmp_path), suffix='_x2').after_test_iter(None, 0, None, [out])
    saved = read_rgb(str(tmp_path / 'Set5' / 'bird_x2.png'))
    np.testing.assert_array_equal(saved, img.permute(1, 2, 0).numpy())
    sr.SaveSRImagesHook(save_dir=None).after_test_iter(None, 0, None, [out])  # disabled: no-op
