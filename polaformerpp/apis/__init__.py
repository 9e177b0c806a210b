"""Inference APIs for the tasks that have no OpenMMLab library behind them, in the
spirit of ``mmdet.apis`` / ``mmseg.apis``.

* super-resolution: :func:`init_restorer` (config + checkpoint -> an
  :class:`~polaformerpp.restoration.SRRestorer` in eval mode) and
  :func:`restore_image` (a BGR image or its path -> the upscaled BGR image);
* class-conditional generation: :func:`init_generator` (-> a
  :class:`~polaformerpp.generation.DiTDiffusion`) and :func:`sample_images`
  (class labels -> uint8 RGB images);
* classification through mmpretrain: ``import polaformerpp`` adds the ImageNet
  classifiers to mmpretrain's model hub (:mod:`.mmpretrain_models`), so
  ``mmpretrain.get_model``, ``list_models``, ``inference_model`` and the
  inferencers accept their names; :func:`register_mmpretrain_models` registers
  another metafile the same way.

Detection and segmentation need nothing here: the configs work with
``mmdet.apis`` and ``mmseg.apis`` as they are, given by path (their inferencers
look model names up only in their own library's model index).

Importing this package is cheap: the task packages are imported on first use.

Example::

    from polaformerpp.apis import init_restorer, restore_image
    model = init_restorer('configs/super_resolution/polapp-srlight_x4_8xb16-500k_div2k-192.py', 'x4.pth')
    sr = restore_image(model, 'photo.png')            # (4 H, 4 W, 3) uint8, BGR
"""
from .generation import init_generator, sample_images
from .mmpretrain_models import register_mmpretrain_models
from .restoration import init_restorer, restore_image

__all__ = ['init_restorer', 'restore_image', 'init_generator', 'sample_images',
           'register_mmpretrain_models']
