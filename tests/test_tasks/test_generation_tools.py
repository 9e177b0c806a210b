"""tools/generation: argument checks, sample.py's .npz as ADM's evaluator reads it, fid.py on feature files."""
import json

import numpy as np
import pytest

from conftest import load_tool
from generation_testing import PIXEL_CONFIG, read_npz_like_adm


def test_generation_tools_bad_arguments_get_clear_errors(tmp_path):
    sample = load_tool('tools/generation/sample.py')
    with pytest.raises(ValueError, match='--cfg-scale must be >= 1'):
        sample.parse_args([PIXEL_CONFIG, 'x.pth', '--out-dir', str(tmp_path), '--cfg-scale', '0.5'])
    with pytest.raises(FileNotFoundError, match='checkpoint not found'):
        sample.parse_args([PIXEL_CONFIG, str(tmp_path / 'x.pth'), '--out-dir', str(tmp_path)])
    fid = load_tool('tools/generation/fid.py')
    images = tmp_path / 'images.npz'
    np.savez(images, arr_0=np.zeros((4, 8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match='--inception PATH'):
        fid.compute(fid.parse_args([str(images), str(images)]))
    with pytest.raises(FileNotFoundError, match='missing.npz'):
        fid.compute(fid.parse_args([str(images), str(tmp_path / 'missing.npz')]))


def test_sample_npz_is_what_the_adm_evaluator_reads(tmp_path):
    """A tiny demo run: ``arr_0`` uint8 (N, H, W, 3), exactly N, streamed as evaluator.py does."""
    import torch
    from mmengine.config import Config
    from mmengine.registry import MODELS

    from polaformerpp.generation import random_class_labels
    sample = load_tool('tools/generation/sample.py')
    cfg = Config.fromfile(PIXEL_CONFIG)
    cfg.model.dit.arch = dict(depth=1, hidden_size=32, num_heads=2, patch_size=8)
    cfg_file, ckpt = tmp_path / 'tiny.py', tmp_path / 'tiny.pth'
    cfg.dump(str(cfg_file))
    torch.manual_seed(0)
    torch.save(dict(state_dict=MODELS.build(cfg.model).state_dict()), ckpt)
    out = sample.main([str(cfg_file), str(ckpt), '--out-dir', str(tmp_path / 'fid'), '--num-samples', '5',
                       '--batch-size', '2', '--steps', '2', '--num-grids', '0', '--no-progress'])
    images = read_npz_like_adm(out, 'arr_0', batch=2)
    assert images.dtype == np.uint8 and images.shape == (5, 32, 32, 3)
    with np.load(out) as data:  # also as the evaluator's in-memory reader and FID tools do
        np.testing.assert_array_equal(data['arr_0'], images)
        np.testing.assert_array_equal(data['arr_1'], random_class_labels(5, 4, seed=0))


def test_fid_tool_on_feature_files(tmp_path):
    rng = np.random.default_rng(0)
    a, b = tmp_path / 'a.npz', tmp_path / 'b.npz'
    np.savez(a, pool=rng.normal(0, 1, (500, 4)), logits=rng.normal(size=(500, 10)))
    np.savez(b, mu=np.full(4, 1.0), sigma=np.eye(4))
    fid = load_tool('tools/generation/fid.py')
    out = tmp_path / 'fid.json'
    result = fid.main([str(a), str(b), '--out-json', str(out)])
    assert result['FID'] == pytest.approx(4.0, abs=0.5) and result['IS'] > 1.0
    assert json.loads(out.read_text())['FID'] == pytest.approx(result['FID'])



def test_fid_tool_reads_image_folders_like_npz(tmp_path):
    """A folder of PNGs gives the same features as an .npz holding the same images."""
    from PIL import Image
    from skimage import data
    photo = np.asarray(Image.fromarray(data.coffee()).resize((96, 64)))
    crops = np.stack([photo[y:y + 16, x:x + 16] for y in range(0, 48, 16) for x in range(0, 80, 16)])
    folder = tmp_path / 'crops'
    (folder / 'nested').mkdir(parents=True)
    for i, crop in enumerate(crops):
        Image.fromarray(crop).save(folder / ('nested' if i % 2 else '.') / f'{i:02d}.png')
    npz = tmp_path / 'crops.npz'
    np.savez(npz, arr_0=crops)
    fid = load_tool('tools/generation/fid.py')
    common = ['--extractor', 'random-conv', '--batch-size', '4', '--no-progress']
    from_folder = fid.main([str(folder), str(npz), *common, '--is-splits', '2'])
    assert from_folder['FID'] == pytest.approx(0.0, abs=1e-6) and from_folder['IS'] > 1.0
    Image.fromarray(photo[:20, :20]).save(folder / 'odd_size.png')
    with pytest.raises(ValueError, match='one size'):
        fid.main([str(folder), str(npz), *common])
