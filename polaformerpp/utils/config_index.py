"""The look-ups behind ``pkg::`` config paths, done once per process while their files are unchanged.

To resolve ``_base_ = 'mmdet::_base_/models/mask-rcnn_r50_fpn.py'``, mmengine
(0.10) first looks the path up as a named experiment:
``mmengine.config.utils._get_cfg_metainfo`` parses the package's
``.mim/model-index.yml`` and every metafile it lists (over 400 YAML files for
mmdet, about 0.2 s on a small CPU), and only when the name is not among them
-- as for every ``_base_/`` fragment -- joins the path to ``.mim/configs``. It
does this for each ``pkg::`` reference of each config it reads: a detection
config of this project has four, so about 0.8 s of the 1 s its
``Config.fromfile`` takes.

:func:`memoize_config_index` (``import polaformerpp`` calls it) makes mmengine
use a form that builds a package's name -> entry table once and reuses it for
as long as the index and its metafiles keep their sizes and modification
times. A look-up gives what mmengine's own gives: a copy of the same entry
(the first one of a name), or the same ``ValueError`` for a name that is not
there; any file it cannot stat sends the call to mmengine's own function.

Before that look-up mmengine asks ``mmengine.utils.is_installed(package)``,
which reloads ``pkg_resources`` (its scan of every installed distribution) on
each call: about 15-30 ms a reference, three quarters of what a config read
costs once the index is memoized. The memoized form remembers the packages it
found installed (a package does not leave a running process) and asks again
for one it did not find, so a package installed meanwhile is still seen.
"""
import copy
import os
import os.path as osp
import threading
import warnings
from typing import Dict, List, Tuple

from mmengine.config import config as _config_module
from mmengine.config import utils as _config_utils
from mmengine.fileio import load

__all__ = ['memoize_config_index']


def _file_key(path: str) -> Tuple[str, int, int]:
    info = os.stat(path)
    return path, info.st_mtime_ns, info.st_size


class _PackageIndex:
    """One package's ``.mim`` model index: config name (``'<name>'`` of ``'<task>/<name>'``) -> entry."""

    def __init__(self, package_path: str):
        # (path, mtime, size) of the index, then of each metafile, each taken before the file is
        # read: a change while reading shows at the next look-up
        index_path = osp.join(package_path, '.mim', 'model-index.yml')
        self.file_keys: List[Tuple[str, int, int]] = [_file_key(index_path)]
        self.table: Dict[str, dict] = {}
        for meta in load(index_path)['Import']:
            meta_path = osp.join(package_path, '.mim', meta)
            self.file_keys.append(_file_key(meta_path))
            for entry in load(meta_path)['Models']:
                if 'Config' not in entry:
                    warnings.warn(f'There is not `Config` define in {entry}')
                    continue
                self.table.setdefault(entry['Config'].partition('/')[-1], entry)

    def is_current(self) -> bool:
        """Whether the index and every metafile it lists still have the size and time they were read at."""
        return all(_file_key(path) == (path, mtime, size) for path, mtime, size in self.file_keys)


def _memoized(get_cfg_metainfo):
    indexes: Dict[str, _PackageIndex] = {}
    lock = threading.Lock()

    def cached_get_cfg_metainfo(package_path: str, cfg_path: str) -> dict:
        try:
            with lock:
                index = indexes.get(package_path)
                if index is None or not index.is_current():
                    index = indexes[package_path] = _PackageIndex(package_path)
        except OSError:  # a file that is missing or unreadable: mmengine's own error
            return get_cfg_metainfo(package_path, cfg_path)
        if cfg_path not in index.table:
            raise ValueError(f'Expected configs: {index.table.keys()}, but got {cfg_path}')
        return copy.deepcopy(index.table[cfg_path])

    cached_get_cfg_metainfo.__doc__ = get_cfg_metainfo.__doc__
    cached_get_cfg_metainfo.uncached = get_cfg_metainfo  # mmengine's own; also marks the wrapper
    return cached_get_cfg_metainfo


def _remembering_installed(is_installed):
    installed = set()

    def remembering_is_installed(package: str) -> bool:
        if package in installed:
            return True
        found = is_installed(package)
        if found:
            installed.add(package)
        return found

    remembering_is_installed.__doc__ = is_installed.__doc__
    remembering_is_installed.uncached = is_installed  # mmengine's own; also marks the wrapper
    return remembering_is_installed


def memoize_config_index() -> None:
    """Make mmengine read each package's config index once while it is unchanged, and remember the
    packages it found installed, for ``pkg::`` config paths (idempotent)."""
    if not hasattr(_config_utils._get_cfg_metainfo, 'uncached'):
        _config_utils._get_cfg_metainfo = _memoized(_config_utils._get_cfg_metainfo)
    if not hasattr(_config_module.is_installed, 'uncached'):
        _config_module.is_installed = _remembering_installed(_config_module.is_installed)
