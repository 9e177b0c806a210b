"""PolaFormer++: polarity-aware linear attention with channel-wise spiky feature maps.

``import polaformerpp`` (or ``custom_imports=dict(imports=['polaformerpp'])`` in
a config) registers the backbone in mmengine's root ``MODELS`` registry, so
``type='PolaFormerPP'`` builds under the mmpretrain, mmdet and mmseg scopes.
"""
from . import models  # noqa: F401
from .ops import pola_attention, pola_rope_tables
from .version import __version__

__all__ = ['__version__', 'pola_attention', 'pola_rope_tables']
