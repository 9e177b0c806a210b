"""PolaFormer++: polarity-aware linear attention with channel-wise spiky feature maps.

``import polaformerpp`` (or ``custom_imports=dict(imports=['polaformerpp'])`` in
a config) registers the backbone in mmengine's root ``MODELS`` registry, so
``type='PolaFormerPP'`` builds under the mmpretrain, mmdet and mmseg scopes.

It also registers the ``polaformerpp::`` config scope
(:mod:`polaformerpp.utils.config_scope`): a config anywhere can inherit this
package's configs, ``_base_ = ['polaformerpp::classification/polapp-b0_8xb256_in1k.py']``.
``_base_`` is read before ``custom_imports`` run, so for that the import has to
happen before the config is read (this project's tools do it).

And it makes checkpoint loading safe and mmengine-aware
(:func:`polaformerpp.utils.checkpoint.register_safe_globals`): ``torch.load``
with ``weights_only=True`` accepts the types of mmengine's Runner checkpoints
(message hub, numpy state) and nothing else, and mmengine's local-file loader
names the file when it refuses one.

And it gives mmpretrain's model hub the ImageNet classifiers by name
(:mod:`polaformerpp.apis.mmpretrain_models`), without importing mmpretrain:
``mmpretrain.get_model('polapp-b2_8xb256_in1k', pretrained=CKPT)``,
``list_models('polapp*')`` and ``ImageClassificationInferencer(<name>, pretrained=CKPT)`` work.

And it makes mmengine read the config index of a ``pkg::`` package (``mmdet::``,
``mmseg::``, ...) once per process instead of once per reference
(:mod:`polaformerpp.utils.config_index`): the same configs, read in a fraction of the time.
"""
from . import models  # noqa: F401
from .ops import pola_attention, pola_rope_tables
from .utils.checkpoint import register_safe_globals
from .utils.config_index import memoize_config_index
from .utils.config_scope import register_config_scope
from .version import __version__

register_config_scope()
register_safe_globals()
memoize_config_index()

from .apis.mmpretrain_models import register_on_mmpretrain_import  # noqa: E402 (after the scope exists)

register_on_mmpretrain_import()

__all__ = ['__version__', 'pola_attention', 'pola_rope_tables']
