"""FID and Inception Score: closed forms, the GenerationFID metric, feature extractors."""
import numpy as np
import pytest
import torch

from polaformerpp.generation import (
    GenerationFID,
    InceptionV3Features,
    RandomConvFeatures,
    feature_statistics,
    frechet_distance,
    inception_score,
    load_reference,
)


def test_frechet_distance_closed_forms():
    rng = np.random.default_rng(0)
    mu1, mu2 = rng.normal(size=5), rng.normal(size=5)
    a, b = rng.uniform(0.1, 2, size=5), rng.uniform(0.1, 2, size=5)
    expected = np.sum((mu1 - mu2) ** 2) + np.sum(a + b - 2 * np.sqrt(a * b))
    assert frechet_distance(mu1, np.diag(a), mu2, np.diag(b)) == pytest.approx(expected, rel=1e-10)
    q, _ = np.linalg.qr(rng.normal(size=(5, 5)))  # commuting covariances with a shared basis
    assert frechet_distance(mu1, q @ np.diag(a) @ q.T, mu2, q @ np.diag(b) @ q.T) == \
        pytest.approx(expected, rel=1e-8)
    s = q @ np.diag(a) @ q.T
    assert frechet_distance(mu1, s, mu1, s) == pytest.approx(0.0, abs=1e-9)
    assert frechet_distance([1.0], [[4.0]], [3.0], [[9.0]]) == pytest.approx(4.0 + (2 - 3) ** 2)
    with pytest.raises(ValueError, match='same D'):
        frechet_distance(mu1, s, mu2[:4], s[:4, :4])
    with pytest.raises(ValueError, match='non-finite'):
        frechet_distance(mu1 * np.nan, s, mu2, s)


def test_fid_of_gaussian_samples_and_inception_score():
    rng = np.random.default_rng(1)
    f1, f2 = rng.normal(0, 1, (20000, 3)), rng.normal(0.5, 2, (20000, 3))
    fid = frechet_distance(*feature_statistics(f1), *feature_statistics(f2))
    assert fid == pytest.approx(3 * 0.25 + 3 * (1 + 4 - 2 * 2), rel=0.05)
    with pytest.raises(ValueError, match='N >= 2'):
        feature_statistics(f1[:1])
    assert inception_score(np.zeros((50, 10)), splits=5)[0] == pytest.approx(1.0)
    confident = np.eye(10)[np.arange(100) % 10] * 50.0
    assert inception_score(confident, splits=1)[0] == pytest.approx(10.0, rel=1e-3)


def test_generation_fid_metric_with_an_injected_extractor(tmp_path):
    metric = GenerationFID(feature_extractor=RandomConvFeatures(dim=16, seed=1), reference='batch')
    rng = np.random.default_rng(0)
    for _ in range(2):
        reals = [torch.from_numpy(rng.integers(0, 256, (3, 16, 16), dtype=np.uint8)) for _ in range(6)]
        fakes = [dict(fake_img=torch.from_numpy(rng.integers(0, 128, (3, 16, 16), dtype=np.uint8)),
                      gt_label=0) for _ in range(6)]
        metric.process(dict(inputs=reals), fakes)
    result = metric.compute_metrics(metric.results)
    assert np.isfinite(result['FID']) and result['FID'] > 0 and result['IS'] >= 1.0

    def stats_only(images):  # any callable with the extractor contract works
        return dict(pool=images.float().mean(dim=(2, 3)))

    ref = tmp_path / 'ref.npz'
    np.savez(ref, pool=rng.normal(size=(32, 3)))
    metric = GenerationFID(feature_extractor=stats_only, reference=str(ref))
    metric.process(dict(inputs=[]), fakes)
    result = metric.compute_metrics(metric.results)
    assert set(result) == {'FID'} and np.isfinite(result['FID'])
    loaded = load_reference(str(ref))
    assert loaded['mu'].shape == (3, ) and loaded['sigma'].shape == (3, 3)



@pytest.mark.filterwarnings('ignore::FutureWarning')  # torch.jit is deprecated in torch 2.x
def test_inception_features_from_a_torchscript_file(tmp_path):
    class PoolAndLogits(torch.nn.Module):  # stands in for a scripted Inception-v3
        def forward(self, x):
            pool = x.mean(dim=(2, 3))
            return pool, pool[:, :2]

    path = str(tmp_path / 'inception.pt')
    torch.jit.script(PoolAndLogits()).save(path)
    extractor = InceptionV3Features(path, resize=20)
    assert extractor.scripted is not None
    out = extractor(torch.full((2, 3, 8, 8), 255, dtype=torch.uint8))
    assert out['pool'].shape == (2, 3) and out['logits'].shape == (2, 2)
    torch.testing.assert_close(out['pool'], torch.ones(2, 3))  # uint8 255 -> 1.0 in [-1, 1]



def test_fid_bad_inputs_get_clear_errors(tmp_path):
    with pytest.raises(ValueError, match='no weights'):
        InceptionV3Features(None)
    with pytest.raises(FileNotFoundError, match='Inception-v3 weights'):
        InceptionV3Features(str(tmp_path / 'inception.pth'))
    not_inception = tmp_path / 'other.pth'
    torch.save({'w': torch.zeros(1)}, not_inception)
    with pytest.raises(ValueError, match='neither TorchScript nor an inception_v3'):
        InceptionV3Features(str(not_inception))
    bad = tmp_path / 'bad.npz'
    np.savez(bad, something=np.zeros(3))
    with pytest.raises(ValueError, match="none of the keys"):
        load_reference(str(bad))
