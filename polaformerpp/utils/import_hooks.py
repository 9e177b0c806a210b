"""Run code right after another package's module is imported, without importing it first.

:func:`call_after_import` is how ``import polaformerpp`` adds its models to
mmpretrain's model hub while leaving mmpretrain (and its many imports) unloaded
until a program imports it itself.
"""
import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Callable

__all__ = ['call_after_import']


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    """A one-shot ``sys.meta_path`` entry: finds ``name`` with the other finders and makes its
    loader call ``callback(module)`` once the module has executed."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]):
        self.name = name
        self.callback = callback
        self._searching = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self._searching:
            return None
        self._searching = True
        try:
            spec = importlib.util.find_spec(fullname)  # the other finders (this one answers None now)
        finally:
            self._searching = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, 'exec_module'):
            return None  # nothing to wrap: the import proceeds as if this finder did not exist
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        execute, callback = spec.loader.exec_module, self.callback

        def exec_module(module):
            execute(module)
            callback(module)

        spec.loader.exec_module = exec_module  # this module's own loader object only
        return spec


def call_after_import(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` for the module ``name``: now if it is imported, else when it is.

    ``callback`` runs once, right after the module's code has run (before the
    statement that imported it returns). Exceptions it raises propagate to that
    import, so a callback that must never break the import catches its own.

    Args:
        name: the module's full dotted name, e.g. ``'mmpretrain.apis.model'``.
        callback: called with the module object.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f'call_after_import: expected a module name, got {name!r}')
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    sys.meta_path.insert(0, _AfterImportFinder(name, callback))
