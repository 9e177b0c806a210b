"""PolaFormer++: polarity-aware linear attention with channel-wise spiky feature maps.

``import polaformerpp`` (or ``custom_imports=dict(imports=['polaformerpp'])`` in
a config) registers the backbone in mmengine's root ``MODELS`` registry, so
``type='PolaFormerPP'`` builds under the mmpretrain, mmdet and mmseg scopes.

It also registers the ``polaformerpp::`` config scope
(:mod:`polaformerpp.utils.config_scope`): a config anywhere can inherit this
package's configs, ``_base_ = ['polaformerpp::classification/polapp-b0_8xb256_in1k.py']``.
``_base_`` is read before ``custom_imports`` run, so for that the import has to
happen before the config is read (this project's tools do it).
"""
from . import models  # noqa: F401
from .ops import pola_attention, pola_rope_tables
from .utils.config_scope import register_config_scope
from .version import __version__

register_config_scope()

__all__ = ['__version__', 'pola_attention', 'pola_rope_tables']
