"""FID and Inception Score: the maths and an mmengine metric.

FID between Gaussians fitted to two feature sets::

    FID = |mu1 - mu2|^2 + tr(S1) + tr(S2) - 2 tr((S1 S2)^(1/2))

with ``tr((S1 S2)^(1/2)) = tr((S1^(1/2) S2 S1^(1/2))^(1/2))``, computed from
symmetric eigendecompositions (no SciPy needed). IS is
``exp(E_x KL(p(y|x) || p(y)))`` averaged over splits.
"""
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from mmengine.evaluator import BaseMetric
from mmengine.registry import METRICS

from .features import build_feature_extractor, extract_features, extract_folder_features

__all__ = ['frechet_distance', 'feature_statistics', 'inception_score', 'load_reference',
           'GenerationFID']


def _sqrtm_psd(mat: np.ndarray) -> np.ndarray:
    """Square root of a symmetric positive semi-definite matrix."""
    w, v = np.linalg.eigh((mat + mat.T) / 2)
    return (v * np.sqrt(np.clip(w, 0, None))) @ v.T


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray,
                     sigma2: np.ndarray) -> float:
    """Fréchet distance between ``N(mu1, sigma1)`` and ``N(mu2, sigma2)`` (float64)."""
    mu1, mu2 = np.atleast_1d(np.asarray(mu1, np.float64)), np.atleast_1d(np.asarray(mu2, np.float64))
    sigma1 = np.atleast_2d(np.asarray(sigma1, np.float64))
    sigma2 = np.atleast_2d(np.asarray(sigma2, np.float64))
    d = mu1.shape[0]
    if mu2.shape != (d, ) or sigma1.shape != (d, d) or sigma2.shape != (d, d):
        raise ValueError(f'mu must be (D,) and sigma (D, D) for the same D; got mu1 {mu1.shape}, '
                         f'sigma1 {sigma1.shape}, mu2 {mu2.shape}, sigma2 {sigma2.shape}')
    for name, arr in (('mu1', mu1), ('sigma1', sigma1), ('mu2', mu2), ('sigma2', sigma2)):
        if not np.isfinite(arr).all():
            raise ValueError(f'{name} has non-finite values')
    root1 = _sqrtm_psd(sigma1)
    cross = np.linalg.eigvalsh(root1 @ sigma2 @ root1)
    tr_covmean = np.sqrt(np.clip(cross, 0, None)).sum()
    diff = mu1 - mu2
    fid = float(diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2 * tr_covmean)
    return max(fid, 0.0)  # >= 0 in exact arithmetic; clears rounding noise of equal sets


def feature_statistics(features: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Mean ``(D,)`` and covariance ``(D, D)`` of ``(N, D)`` features (``N >= 2``)."""
    features = np.asarray(features, np.float64)
    if features.ndim != 2 or features.shape[0] < 2:
        raise ValueError(f'features must be (N, D) with N >= 2, got shape {features.shape}')
    return features.mean(axis=0), np.cov(features, rowvar=False).reshape(features.shape[1], -1)


def inception_score(logits: np.ndarray, splits: int = 10) -> Tuple[float, float]:
    """Inception Score (mean, std over ``splits``) from class logits ``(N, K)``."""
    logits = torch.as_tensor(np.asarray(logits), dtype=torch.float64)
    if logits.dim() != 2 or logits.shape[0] < 1:
        raise ValueError(f'logits must be (N, K), got shape {tuple(logits.shape)}')
    log_p = torch.log_softmax(logits, dim=1)
    splits = max(1, min(splits, logits.shape[0]))
    scores = []
    for part in torch.tensor_split(log_p, splits):
        log_marginal = torch.logsumexp(part, dim=0) - np.log(part.shape[0])
        kl = (part.exp() * (part - log_marginal)).sum(dim=1).mean()
        scores.append(float(kl.exp()))
    return float(np.mean(scores)), float(np.std(scores))


def load_reference(path: str, extractor=None, batch_size: int = 64,
                   prefer_stats: bool = True, progress: Optional[bool] = False) -> Dict[str, np.ndarray]:
    """Read an ``.npz`` of reference statistics, features or images, or a folder of images.

    Recognised keys: ``mu`` + ``sigma`` (statistics), ``pool`` (features
    ``(N, D)``), ``arr_0`` (uint8 images ``(N, H, W, 3)``, embedded with
    ``extractor``; the layout of ADM's reference batches and sample files).
    A folder's image files (PNG, JPEG, ..., all of one size) are embedded with
    ``extractor`` too.

    Args:
        progress: a bar over the embedded images (``False`` none, ``None``
            when stderr is a terminal, ``True`` always).

    Returns:
        dict: ``mu``, ``sigma`` and, where available, ``pool``/``logits``.
    """
    if osp.isdir(path):
        if extractor is None:
            raise ValueError(f'{path!r} is an image folder: a feature extractor is needed')
        out = extract_folder_features(extractor, path, batch_size, progress=progress,
                                      desc=f'features of {path}')
        out['mu'], out['sigma'] = feature_statistics(out['pool'])
        return out
    if not osp.isfile(path):
        raise FileNotFoundError(f'reference/sample file {path!r} not found')
    with np.load(path) as data:
        keys = set(data.files)
        if prefer_stats and {'mu', 'sigma'} <= keys:
            return dict(mu=data['mu'], sigma=data['sigma'])
        if 'pool' in keys:
            out = dict(pool=data['pool'])
            if 'logits' in keys:
                out['logits'] = data['logits']
        elif 'arr_0' in keys:
            if extractor is None:
                raise ValueError(f'{path!r} holds images (arr_0): a feature extractor is needed')
            out = extract_features(extractor, data['arr_0'], batch_size, progress=progress,
                                   desc=f'features of {path}')
        elif {'mu', 'sigma'} <= keys:
            return dict(mu=data['mu'], sigma=data['sigma'])
        else:
            raise ValueError(f"{path!r} has none of the keys 'mu'+'sigma', 'pool' or 'arr_0' "
                             f'(found {sorted(keys)})')
    out['mu'], out['sigma'] = feature_statistics(out['pool'])
    return out


@METRICS.register_module()
class GenerationFID(BaseMetric):
    """FID (and IS) of generated samples, as an mmengine metric.

    Consumes the ``fake_img`` uint8 ``(3, H, W)`` outputs of
    ``DiTDiffusion(mode='predict')``. The real side is either the evaluation
    batches' own images (``reference='batch'``) or an ``.npz`` file read by
    :func:`load_reference`.

    Args:
        feature_extractor (dict | nn.Module | callable): e.g.
            ``dict(type='InceptionV3Features', weights='data/inception/pt_inception.pth')``.
        reference (str): ``'batch'`` or an ``.npz`` path.
        inception_score (bool): also report IS when the extractor gives logits.
        is_splits (int): IS splits.
        batch_size (int): feature-extraction batch.

    Metrics: ``FID`` and ``IS`` (prefix ``gen/``).
    """

    default_prefix = 'gen'

    def __init__(self, feature_extractor: Union[dict, object], reference: str = 'batch',
                 inception_score: bool = True, is_splits: int = 10, batch_size: int = 64,
                 collect_device: str = 'cpu', prefix: Optional[str] = None):
        super().__init__(collect_device=collect_device, prefix=prefix)
        self.extractor = build_feature_extractor(feature_extractor)
        if reference != 'batch' and not osp.isfile(reference):
            raise FileNotFoundError(f"GenerationFID: reference must be 'batch' or an existing .npz, "
                                    f'got {reference!r}')
        self.reference = reference
        self.inception_score = inception_score
        self.is_splits = is_splits
        self.batch_size = batch_size
        self._reference_stats = None

    def _device(self):
        return 'cuda' if torch.cuda.is_available() else None

    def process(self, data_batch: dict, data_samples: Sequence[dict]) -> None:
        fakes = torch.stack([torch.as_tensor(s['fake_img']) for s in data_samples])
        fake = extract_features(self.extractor, fakes.cpu(), self.batch_size, self._device())
        real = None
        if self.reference == 'batch':
            reals = data_batch['inputs']
            reals = torch.stack(list(reals)) if isinstance(reals, (list, tuple)) else reals
            real = extract_features(self.extractor, reals.cpu(), self.batch_size, self._device())
        for i in range(fakes.shape[0]):
            item = dict(fake=fake['pool'][i])
            if 'logits' in fake:
                item['fake_logits'] = fake['logits'][i]
            if real is not None and i < real['pool'].shape[0]:
                item['real'] = real['pool'][i]
            self.results.append(item)

    def compute_metrics(self, results: List[dict]) -> Dict[str, float]:
        fake = np.stack([r['fake'] for r in results])
        mu_f, sigma_f = feature_statistics(fake)
        if self.reference == 'batch':
            mu_r, sigma_r = feature_statistics(np.stack([r['real'] for r in results if 'real' in r]))
        else:
            if self._reference_stats is None:
                ref = load_reference(self.reference, self.extractor, self.batch_size)
                self._reference_stats = (ref['mu'], ref['sigma'])
            mu_r, sigma_r = self._reference_stats
        metrics = dict(FID=frechet_distance(mu_f, sigma_f, mu_r, sigma_r))
        if self.inception_score and all('fake_logits' in r for r in results):
            metrics['IS'] = inception_score(np.stack([r['fake_logits'] for r in results]),
                                            self.is_splits)[0]
        return metrics
