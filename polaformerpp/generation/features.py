"""Feature extractors for FID / Inception Score.

Every extractor maps uint8 images ``(N, 3, H, W)`` to
``dict(pool=(N, D) float[, logits=(N, K)])``. FID compares ``pool`` statistics,
IS uses ``logits``; values are comparable only between sets embedded by the
same network.

* :class:`InceptionV3Features`: Inception-v3 pool3 (2048-d) from a local file,
  either a TorchScript module or a torchvision ``inception_v3`` state dict.
  The weights are an optional dependency (nothing is downloaded).
* :class:`RandomConvFeatures`: a small fixed random conv net (seeded), a
  stand-in for smoke tests and tiny pixel-space runs; its FID is not the
  published metric.

:func:`extract_features` embeds image arrays, :func:`extract_folder_features`
the image files of a folder, both in batches and optionally with a progress
bar on stderr.
"""
import os
import os.path as osp
import warnings
import zipfile
from typing import Callable, Dict, Iterable, List, Optional, Union

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.registry import MODELS
from torch import Tensor

from polaformerpp.utils.progress import ProgressBar

__all__ = ['InceptionV3Features', 'RandomConvFeatures', 'build_feature_extractor',
           'extract_features', 'extract_folder_features', 'list_image_files', 'INCEPTION_HELP',
           'IMAGE_EXTENSIONS']

#: file types :func:`list_image_files` picks up (lower case)
IMAGE_EXTENSIONS = ('.png', '.jpg', '.jpeg', '.bmp', '.webp')

INCEPTION_HELP = ('FID/IS need Inception-v3 weights on disk: a TorchScript file whose forward maps '
                  'images to pool3 features (N, 2048) [or (pool3, logits)], or a state dict of '
                  'torchvision.models.inception_v3 (e.g. converted from the FID network '
                  'pt_inception-2015-12-05). Pass its path as weights=... (CLI: --inception PATH).')


def _images_to_unit_range(images: Tensor, size: Optional[int]) -> Tensor:
    """uint8 ``(N, 3, H, W)`` -> float in [-1, 1], bilinearly resized to ``size`` if given."""
    x = images.float() / 127.5 - 1.0
    if size is not None and tuple(x.shape[-2:]) != (size, size):
        x = F.interpolate(x, size=(size, size), mode='bilinear', align_corners=False)
    return x


def _is_torchscript(path: str) -> bool:
    """TorchScript archives are zip files with ``<name>/constants.pkl`` and ``<name>/code/``."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(name.endswith('/constants.pkl') for name in archive.namelist())


def _as_feature_dict(out) -> Dict[str, Tensor]:
    if isinstance(out, dict):
        return {k: v for k, v in out.items() if k in ('pool', 'logits')}
    if isinstance(out, (tuple, list)):
        return dict(pool=out[0], logits=out[1]) if len(out) > 1 else dict(pool=out[0])
    return dict(pool=out)


@MODELS.register_module()
class InceptionV3Features(nn.Module):
    """Inception-v3 pool3 features and class logits from a local weights file.

    Args:
        weights (str): TorchScript module or torchvision ``inception_v3`` state dict.
        resize (int): input side; images are bilinearly resized to it and scaled
            to [-1, 1] (the FID network's input convention).
        torchscript_uint8 (bool): pass TorchScript modules the raw uint8 images
            instead (for modules that resize/normalise themselves).
    """

    def __init__(self, weights: Optional[str], resize: int = 299, torchscript_uint8: bool = False):
        super().__init__()
        if not weights:
            raise ValueError(f'InceptionV3Features: no weights given. {INCEPTION_HELP}')
        if not osp.isfile(weights):
            raise FileNotFoundError(f'InceptionV3Features: weights file {weights!r} not found. '
                                    f'{INCEPTION_HELP}')
        self.resize = resize
        self.torchscript_uint8 = torchscript_uint8
        self.scripted = None
        if _is_torchscript(weights):
            with warnings.catch_warnings():
                warnings.simplefilter('ignore', FutureWarning)  # torch.jit is deprecated in torch 2.x
                self.scripted = torch.jit.load(weights, map_location='cpu').eval()
        else:
            self.net, self.fc = self._torchvision_inception(weights)

    @staticmethod
    def _torchvision_inception(path: str):
        from torchvision.models import inception_v3
        state = torch.load(path, map_location='cpu', weights_only=True)
        if isinstance(state, dict) and 'state_dict' in state:
            state = state['state_dict']
        if not isinstance(state, dict) or 'fc.weight' not in state:
            raise ValueError(f'{path!r} is neither TorchScript nor an inception_v3 state dict '
                             f"(no 'fc.weight'). {INCEPTION_HELP}")
        state = {k: v for k, v in state.items() if not k.startswith('AuxLogits.')}
        net = inception_v3(weights=None, aux_logits=False, init_weights=False,
                           num_classes=state['fc.weight'].shape[0])
        net.load_state_dict(state)
        fc = net.fc
        net.fc = nn.Identity()  # forward now ends at pool3 (dropout is a no-op in eval)
        return net.eval(), fc.eval()

    def train(self, mode: bool = True):
        return super().train(False)

    @torch.no_grad()
    def forward(self, images: Tensor) -> Dict[str, Tensor]:
        """uint8 ``(N, 3, H, W)`` -> ``dict(pool=(N, 2048)[, logits=(N, K)])``."""
        if self.scripted is not None:
            x = images if self.torchscript_uint8 else _images_to_unit_range(images, self.resize)
            return _as_feature_dict(self.scripted(x))
        pool = self.net(_images_to_unit_range(images, self.resize))
        return dict(pool=pool, logits=self.fc(pool))


@MODELS.register_module()
class RandomConvFeatures(nn.Module):
    """A fixed, randomly initialised conv net (seeded): a cheap stand-in feature extractor.

    Three stride-2 3x3 convs with ReLU, global average pooling -> ``dim``
    features, and a fixed random linear map to ``num_logits`` logits.
    """

    def __init__(self, dim: int = 64, num_logits: int = 10, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        widths = (3, 32, 64, dim)
        self.convs = nn.ModuleList(nn.Conv2d(i, o, 3, stride=2, padding=1)
                                   for i, o in zip(widths[:-1], widths[1:]))
        self.head = nn.Linear(dim, num_logits)
        with torch.no_grad():
            for p in self.parameters():
                fan_in = p[0].numel() if p.dim() > 1 else p.numel()
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
        self.requires_grad_(False)

    @torch.no_grad()
    def forward(self, images: Tensor) -> Dict[str, Tensor]:
        x = _images_to_unit_range(images, None)
        for conv in self.convs:
            x = F.relu(conv(x))
        pool = x.mean(dim=(2, 3))
        return dict(pool=pool, logits=self.head(pool))


def build_feature_extractor(extractor: Union[dict, nn.Module, Callable]) -> Callable:
    """A config dict (built from ``MODELS``), a module or any callable with the extractor contract."""
    if isinstance(extractor, dict):
        return MODELS.build(extractor)
    if callable(extractor):
        return extractor
    raise TypeError(f'feature_extractor must be a config dict, an nn.Module or a callable, '
                    f'got {type(extractor).__name__}')


def _resolve_device(extractor: Callable, device):
    """Move a module extractor to ``device``, or read the device its parameters are on."""
    if isinstance(extractor, nn.Module):
        if device is not None:
            extractor.to(device)
        else:
            param = next(iter(extractor.parameters()), None)
            device = param.device if param is not None else None
    return device


@torch.no_grad()
def _embed_batches(extractor: Callable, batches: Iterable[Tensor], total: int, device, progress,
                   desc: Optional[str]) -> Dict[str, np.ndarray]:
    """Run ``extractor`` on uint8 ``(B, 3, H, W)`` batches (``total`` images in all, for the bar)."""
    device = _resolve_device(extractor, device)
    chunks: Dict[str, list] = {}
    with ProgressBar(total, desc, enabled=progress) as bar:
        for batch in batches:
            out = _as_feature_dict(extractor(batch if device is None else batch.to(device)))
            if 'pool' not in out:
                raise ValueError("the feature extractor must return pool features ('pool')")
            for key, value in out.items():
                chunks.setdefault(key, []).append(value.detach().double().reshape(value.shape[0], -1).cpu())
            bar.update(batch.shape[0])
    return {k: torch.cat(v).numpy() for k, v in chunks.items()}


def extract_features(extractor: Callable, images: Union[Tensor, np.ndarray], batch_size: int = 64,
                     device=None, progress: Optional[bool] = False,
                     desc: Optional[str] = None) -> Dict[str, np.ndarray]:
    """Embed uint8 images (``(N, 3, H, W)`` tensor or ``(N, H, W, 3)`` array) in batches.

    Args:
        progress: a bar over the images on stderr: ``False`` (default) none,
            ``None`` when stderr is a terminal, ``True`` always
            (see :mod:`polaformerpp.utils.progress`).
        desc: the bar's title.

    Returns:
        dict: ``pool`` ``(N, D)`` float64 and, when the extractor gives them, ``logits``.
    """
    if batch_size < 1:
        raise ValueError(f'batch_size must be >= 1, got {batch_size}')
    if isinstance(images, np.ndarray):
        if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
            raise ValueError(f'image arrays must be uint8 (N, H, W, 3), got {images.dtype} '
                             f'{images.shape}')
        images = torch.from_numpy(images).permute(0, 3, 1, 2)
    if images.dim() != 4 or images.shape[1] != 3 or images.dtype != torch.uint8:
        raise ValueError(f'images must be uint8 (N, 3, H, W), got {images.dtype} {tuple(images.shape)}')
    batches = (images[start:start + batch_size] for start in range(0, images.shape[0], batch_size))
    return _embed_batches(extractor, batches, images.shape[0], device, progress, desc)


def list_image_files(folder: str) -> List[str]:
    """The image files (:data:`IMAGE_EXTENSIONS`) under ``folder``, recursively, sorted by path."""
    if not osp.isdir(folder):
        raise FileNotFoundError(f'image folder {folder!r} not found')
    files = [osp.join(root, name) for root, _, names in os.walk(folder) for name in names
             if name.lower().endswith(IMAGE_EXTENSIONS)]
    return sorted(files)


def _read_rgb(path: str) -> np.ndarray:
    from PIL import Image
    with Image.open(path) as img:
        return np.asarray(img.convert('RGB'), dtype=np.uint8)


def _folder_batches(files: List[str], batch_size: int) -> Iterable[Tensor]:
    """uint8 ``(B, 3, H, W)`` batches of the files; every image must have the first one's size."""
    size = None
    for start in range(0, len(files), batch_size):
        arrays = []
        for path in files[start:start + batch_size]:
            array = _read_rgb(path)
            if size is None:
                size = array.shape
            elif array.shape != size:
                raise ValueError(f'{path}: image size {array.shape[1]}x{array.shape[0]} differs from '
                                 f'{size[1]}x{size[0]} of {files[0]}; the images of a folder must all '
                                 f'have one size (resize or crop them first)')
            arrays.append(array)
        yield torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2)


def extract_folder_features(extractor: Callable, folder: str, batch_size: int = 64, device=None,
                            progress: Optional[bool] = False,
                            desc: Optional[str] = None) -> Dict[str, np.ndarray]:
    """Embed the images of a folder (all of one size), reading ``batch_size`` files at a time.

    Same output and ``progress`` as :func:`extract_features`; the images are in
    the order of :func:`list_image_files`.
    """
    if batch_size < 1:
        raise ValueError(f'batch_size must be >= 1, got {batch_size}')
    files = list_image_files(folder)
    if not files:
        raise ValueError(f'image folder {folder!r} holds no image files ({", ".join(IMAGE_EXTENSIONS)})')
    return _embed_batches(extractor, _folder_batches(files, batch_size), len(files), device, progress, desc)
