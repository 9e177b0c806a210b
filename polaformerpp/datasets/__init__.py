"""Datasets the OpenMMLab libraries lack, one module per task.

Each module registers its classes in its library's registry when imported, so
this package imports nothing itself (``import polaformerpp`` stays free of
mmdet/mmseg); a config names the module in ``custom_imports``, e.g.
``custom_imports = dict(imports=['polaformerpp', 'polaformerpp.datasets.coco_checks'])``.
"""
