"""Lightweight image super-resolution with PolaFormer++ global attention.

``import polaformerpp.restoration`` (or ``custom_imports=dict(imports=
['polaformerpp.restoration'])`` in a config) registers, in mmengine's root
registries (so they build with ``default_scope=None`` and from any child
scope):

* MODELS: :class:`PolaPPSRLight` (network), :class:`SRRestorer` (L1 training
  and prediction), :class:`SRDataPreprocessor`;
* DATASETS: :class:`PairedImageDataset`, :class:`SRBenchmarkDataset`;
* TRANSFORMS: ``LoadPairedImages``, ``PairedRandomCrop``, ``PairedFlipRot``, ``PackSRInputs``;
* METRICS: ``PSNR``, ``SSIM`` (Y channel, border crop = scale);
* HOOKS: ``SaveSRImagesHook`` (PNG outputs of ``tools/test.py``).
"""
from .datasets import PairedImageDataset, SRBenchmarkDataset
from .hooks import SaveSRImagesHook
from .metrics import PSNR, SSIM, psnr, rgb_to_y, ssim
from .model import DIV2K_RGB_MEAN, SRDataPreprocessor, SRRestorer
from .network import PolaPPSRLight
from .resize import imresize, modcrop
from .transforms import LoadPairedImages, PackSRInputs, PairedFlipRot, PairedRandomCrop

__all__ = [
    'PolaPPSRLight', 'SRRestorer', 'SRDataPreprocessor', 'DIV2K_RGB_MEAN', 'PairedImageDataset',
    'SRBenchmarkDataset', 'LoadPairedImages', 'PairedRandomCrop', 'PairedFlipRot', 'PackSRInputs',
    'PSNR', 'SSIM', 'psnr', 'ssim', 'rgb_to_y', 'imresize', 'modcrop', 'SaveSRImagesHook'
]
