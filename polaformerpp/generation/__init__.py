"""Class-conditional image generation: DiT with PolaFormer++ attention, Gaussian diffusion, FID.

Importing this package (``custom_imports=dict(imports=['polaformerpp.generation'])``)
registers in mmengine's root registries:

* ``MODELS``: ``DiT`` and ``DiT-S/2`` ... ``DiT-XL/8``, ``DiTDiffusion`` (the
  trainable model), ``DiffusionDataPreprocessor``, ``SDVAE``,
  ``InceptionV3Features``, ``RandomConvFeatures``;
* ``DATASETS``: ``ClassImageFolder``, ``RandomClassLabels``;
* ``METRICS``: ``GenerationFID``.

:func:`label_swap_gap` and :func:`conditioning_scales` tell whether a trained
model uses its class label.
"""
from .datasets import ClassImageFolder, RandomClassLabels, center_crop_image
from .diagnostics import conditioning_scales, format_gap_table, label_swap_gap, wrong_labels
from .diffusion import (
    GaussianDiffusion,
    discretized_gaussian_log_likelihood,
    linear_beta_schedule,
    normal_kl,
    randn_batch,
    space_timesteps,
)
from .dit import DIT_ARCHS, DIT_SIZES, DiT, build_dit, dit_param_count
from .features import InceptionV3Features, RandomConvFeatures, build_feature_extractor, extract_features
from .metrics import GenerationFID, feature_statistics, frechet_distance, inception_score, load_reference
from .model import DiffusionDataPreprocessor, DiTDiffusion
from .sampling import guided_model_fn, make_grid, random_class_labels, sample_generators, to_uint8
from .vae import SDVAE

__all__ = [
    'DiT', 'DIT_ARCHS', 'DIT_SIZES', 'build_dit', 'dit_param_count', 'GaussianDiffusion',
    'linear_beta_schedule', 'space_timesteps', 'normal_kl', 'discretized_gaussian_log_likelihood',
    'randn_batch', 'DiTDiffusion', 'DiffusionDataPreprocessor', 'SDVAE', 'ClassImageFolder', 'RandomClassLabels',
    'center_crop_image', 'GenerationFID', 'frechet_distance', 'feature_statistics',
    'inception_score', 'load_reference', 'InceptionV3Features', 'RandomConvFeatures',
    'build_feature_extractor', 'extract_features', 'guided_model_fn', 'random_class_labels', 'sample_generators',
    'to_uint8', 'make_grid', 'label_swap_gap', 'conditioning_scales', 'format_gap_table', 'wrong_labels'
]
