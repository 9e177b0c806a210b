"""The ``polaformerpp::`` config scope: inherit this package's configs from anywhere.

After ``import polaformerpp`` a config in any folder can write::

    _base_ = ['polaformerpp::detection/mask-rcnn_polapp-b2_fpn_8xb2-amp-1x_coco.py']

mmengine (0.10) resolves ``pkg::path`` like this: the prefix must be a key of
``mmengine.config.utils.MODULE2PACKAGE``; its value is handed to
``mmengine.utils.is_installed`` / ``get_installed_path``, and the config is read
from ``<that path>/.mim/configs/<path>`` (after a look-up in
``<that path>/.mim/model-index.yml``). Installing the package creates
``polaformerpp/.mim`` (setup.py: symlinks to the checkout's ``configs/`` and
``model-index.yml`` for editable installs, copies in wheels), and
:func:`register_config_scope`, called by ``import polaformerpp``, does the rest:

* ``MODULE2PACKAGE['polaformerpp']`` names the module ``polaformerpp.version``
  rather than the distribution. For a distribution, ``get_installed_path`` joins
  the distribution's location with the package name, which for an editable
  (PEP 660) install is ``site-packages/polaformerpp`` -- a folder that does not
  exist. A module name that is no distribution makes mmengine fall back to
  ``importlib.util.find_spec``, i.e. the folder the package is imported from,
  which is right for editable installs, wheels and plain checkouts alike.
* mmengine tags every typed dict of a base config read through ``pkg::`` with
  ``_scope_='pkg'``, so that it is built in that package's registries. This
  package has no registries of its own: its configs are written for the scope
  they set themselves (``default_scope`` = ``'mmpretrain'``, ``'mmdet'``,
  ``'mmseg'``, ...). The tag is therefore translated to the base config's own
  ``default_scope`` (no tag where a base sets none, e.g. a ``_base_/`` fragment),
  which is what ``mmdet::``-style inheritance gives for the libraries' configs.
  mmengine offers no public hook for this step, so :func:`register_config_scope`
  wraps ``Config._dict_to_config_dict`` once (idempotent; any other scope passes
  through unchanged).

``_base_`` is read before a config's ``custom_imports`` run, so the scope has to
be registered before ``Config.fromfile``: the project's tools import
``polaformerpp`` first.
"""
import functools
import importlib.util
import os.path as osp

from mmengine.config import Config
from mmengine.config import utils as config_utils

#: the prefix of scoped config paths, ``polaformerpp::<task>/<config>.py``
SCOPE = __name__.split('.')[0]
#: the module whose folder mmengine takes as the installed package (see the module docstring)
LOCATOR_MODULE = f'{SCOPE}.version'
#: set on the wrapped ``Config._dict_to_config_dict`` so that registering twice wraps once
_WRAPPED_FLAG = '__polaformerpp_scope__'


def package_dir() -> str:
    """The folder of the imported ``polaformerpp`` package (where ``.mim/`` lives)."""
    spec = importlib.util.find_spec(LOCATOR_MODULE)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f'cannot locate {LOCATOR_MODULE!r}: is {SCOPE} installed?')
    return osp.dirname(osp.abspath(spec.origin))


def installed_config_dir() -> str:
    """The folder ``polaformerpp::<path>`` resolves against: ``<package>/.mim/configs``.

    Raises:
        FileNotFoundError: the installation has no ``.mim/configs`` (naming the
            folder and how to create it).
    """
    path = osp.join(package_dir(), '.mim', 'configs')
    if not osp.isdir(path):
        raise FileNotFoundError(
            f'{path} does not exist, so configs cannot inherit "{SCOPE}::..." bases: '
            f'reinstall the package (`pip install -e .` in a checkout, or `pip install .`), '
            f'which creates it; inside a checkout, relative paths to configs/ work without it')
    return path


def _translated_scope(cfg, scope):
    """The scope to tag a base config's dicts with: its own ``default_scope`` for ours."""
    if scope != SCOPE:
        return scope
    own = cfg.get('default_scope') if isinstance(cfg, dict) else None
    return own if isinstance(own, str) and own else None


def _wrap_dict_to_config_dict():
    """Translate the ``polaformerpp`` scope tag in ``Config._dict_to_config_dict`` (once)."""
    original = getattr(Config, '_dict_to_config_dict', None)
    if original is None or getattr(original, _WRAPPED_FLAG, False):
        return

    @functools.wraps(original)
    def dict_to_config_dict(cfg, scope=None, has_scope=True):
        return original(cfg, _translated_scope(cfg, scope), has_scope)

    setattr(dict_to_config_dict, _WRAPPED_FLAG, True)
    Config._dict_to_config_dict = staticmethod(dict_to_config_dict)


def register_config_scope() -> None:
    """Teach mmengine the ``polaformerpp::`` config scope (idempotent; ``import polaformerpp`` calls it)."""
    config_utils.MODULE2PACKAGE[SCOPE] = LOCATOR_MODULE
    _wrap_dict_to_config_dict()


def is_config_scope_registered() -> bool:
    """Whether :func:`register_config_scope` has run in this process."""
    original = getattr(Config, '_dict_to_config_dict', None)
    return (config_utils.MODULE2PACKAGE.get(SCOPE) == LOCATOR_MODULE
            and getattr(original, _WRAPPED_FLAG, False))
