"""Safe and strict checkpoint loading.

Safe: every checkpoint is unpickled with ``torch.load(..., weights_only=True)``.
Besides tensors and plain containers, an mmengine Runner checkpoint
(``epoch_N.pth`` / ``iter_N.pth`` with optimizer, parameter schedulers,
message hub and EMA state) holds only these types, which
:func:`register_safe_globals` allows (once, at ``import polaformerpp``):

* ``mmengine.logging.HistoryBuffer`` (the message hub's logs), and the
  statistics methods it pickles by reference (``HistoryBuffer.min`` etc.,
  written as ``getattr(HistoryBuffer, 'min')``: a restricted ``getattr`` that
  resolves only those is registered under the name ``builtins.getattr``);
* numpy arrays, scalars and dtypes (``numpy.ndarray``, ``numpy.dtype``,
  ``numpy._core.multiarray._reconstruct`` / ``scalar``; the
  ``numpy.core.multiarray`` names of files written with numpy < 2 too), and
  the dtype classes of the fixed-size numeric dtypes (``numpy.dtypes.Float64DType``
  and ``Int64DType`` are in every Runner checkpoint; bool, the other ints and
  floats appear with metrics of those types). Not object, void or string dtypes.

Anything else (a class of another library, ``os.system``, ...) is refused
with :class:`UnsafeCheckpointError`, which names the file and the type, before
anything of the payload runs. A user who trusts such a file opts in with the
tools' ``--unsafe-load`` flag (:func:`set_unsafe_loading`), which unpickles
with ``weights_only=False`` and can run arbitrary code.

mmengine reads local checkpoints (``resume``, ``load_from``,
``init_cfg=dict(type='Pretrained')``, ``load_checkpoint``) through
``CheckpointLoader``; :func:`register_safe_globals` puts
:func:`load_from_local_safe` in place of its local-file backend, so those
errors name the file too.

Strict: :func:`compare_state_dict` lists the parameters and buffers a
checkpoint leaves unfilled (missing), the keys the model does not have
(unexpected) and the shape mismatches; :class:`CheckpointMismatchError`
carries the first few of each kind and the counts. :func:`load_model_weights`
(the APIs, analysis tools, sampling) and :class:`StrictLoadHook` (``tools/test.py``)
refuse an incomplete fit unless ``allow_partial``; fine-tuning
(``load_from`` in training, ``init_cfg=Pretrained``) stays lenient and logs
one summary line (:meth:`LoadReport.summary`).
"""
import logging
import os
import os.path as osp
import pickle
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import List, Mapping, Optional, Tuple

import numpy as np
import torch
from mmengine.hooks import Hook
from mmengine.logging import HistoryBuffer, print_log
from mmengine.model.weight_init import PretrainedInit, update_init_info
from mmengine.registry import WEIGHT_INITIALIZERS
from mmengine.runner import CheckpointLoader
from mmengine.runner import load_state_dict as mm_load_state_dict

__all__ = [
    'UnsafeCheckpointError', 'CheckpointMismatchError', 'LoadReport', 'register_safe_globals',
    'safe_globals_list', 'set_unsafe_loading', 'unsafe_loading_enabled', 'load_checkpoint_file',
    'load_from_local_safe', 'state_dict_of', 'compare_state_dict', 'load_model_weights', 'StrictLoadHook',
    'check_report', 'exit_on_checkpoint_error', 'history_buffer_method', 'SummarizedPretrainedInit', 'UNSAFE_LOAD_HELP',
    'ALLOW_PARTIAL_HELP'
]

#: --help text of the tools' --unsafe-load flag
UNSAFE_LOAD_HELP = ('UNSAFE: unpickle checkpoints with full pickle (torch.load weights_only=False), which can '
                    'run arbitrary code from the file. Only for files you trust that need types beyond '
                    "mmengine's own checkpoints (tensors, numpy, message hub); default: safe loading")
#: --help text of the tools' --allow-partial flag
ALLOW_PARTIAL_HELP = ('proceed with a checkpoint that does not fit the model (missing or unexpected keys, '
                      'shape mismatches); unfilled parameters keep their initial values. Default: refuse')

_UNSAFE_ENV = 'TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD'
_unsafe_loading = False


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint needs a type the safe (``weights_only``) unpickler does not allow."""


class CheckpointMismatchError(RuntimeError):
    """A checkpoint does not fill the model exactly (missing / unexpected keys, shape mismatches)."""


# ----------------------------------------------------------------------------- allow-list
_HISTORY_BUFFER_METHODS = ('min', 'max', 'current', 'mean')
_NUMERIC_DTYPES = ('Bool', 'Int8', 'Int16', 'Int32', 'Int64', 'UInt8', 'UInt16', 'UInt32', 'UInt64', 'Float16',
                   'Float32', 'Float64')


def history_buffer_method(owner, name: str):
    """The ``getattr`` a Runner checkpoint's pickle calls, restricted to ``HistoryBuffer`` statistics.

    ``HistoryBuffer.__getstate__`` stores its ``_statistics_methods`` (functions
    such as ``HistoryBuffer.min``), which pickle writes as
    ``getattr(HistoryBuffer, 'min')``. Only those names on ``HistoryBuffer``
    resolve; anything else raises ``UnpicklingError``.
    """
    if owner is HistoryBuffer and name in _HISTORY_BUFFER_METHODS:
        return getattr(HistoryBuffer, name)
    raise pickle.UnpicklingError(f'getattr({owner!r}, {name!r}) is not allowed: only '
                                 f'HistoryBuffer.{{{", ".join(_HISTORY_BUFFER_METHODS)}}}')


def safe_globals_list() -> list:
    """The allow-list given to ``torch.serialization.add_safe_globals`` (see the module docstring)."""
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy < 2
        from numpy.core import multiarray
    numeric = [getattr(np.dtypes, f'{name}DType') for name in _NUMERIC_DTYPES if hasattr(np.dtypes, f'{name}DType')]
    entries = [HistoryBuffer, np.ndarray, np.dtype, multiarray._reconstruct, multiarray.scalar, *numeric,
               (history_buffer_method, 'builtins.getattr'),
               # files written with numpy < 2 name the same functions by their old module
               (multiarray._reconstruct, 'numpy.core.multiarray._reconstruct'),
               (multiarray.scalar, 'numpy.core.multiarray.scalar')]
    return entries


_registered = False


def register_safe_globals() -> None:
    """Allow the types of mmengine Runner checkpoints in ``weights_only`` loading; idempotent.

    Also makes :func:`load_from_local_safe` mmengine's backend for local files.
    Called by ``import polaformerpp``.
    """
    global _registered
    if _registered:
        return
    torch.serialization.add_safe_globals(safe_globals_list())
    CheckpointLoader.register_scheme(prefixes='', loader=load_from_local_safe, force=True)
    _register_pretrained_init()
    _registered = True


def set_unsafe_loading(enabled: bool) -> None:
    """Opt in (``--unsafe-load``) or out of full unpickling for this process's checkpoint loads.

    Enabled, :func:`load_checkpoint_file` (and so mmengine's resume,
    ``load_from`` and ``init_cfg``) uses ``weights_only=False``: the file can
    run arbitrary code. Disabled (the default), loads are safe even when the
    environment sets ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` (a warning says it is ignored).
    """
    global _unsafe_loading
    _unsafe_loading = bool(enabled)
    if enabled:
        print_log('--unsafe-load: checkpoints are unpickled in full (weights_only=False); a file can run '
                  'arbitrary code: use it only for files you trust', logger='current', level=logging.WARNING)
    elif os.environ.get(_UNSAFE_ENV, '0').lower() in ('1', 'y', 'yes', 'true'):
        print_log(f'{_UNSAFE_ENV} is set but ignored: checkpoints load with weights_only=True; pass '
                  '--unsafe-load to trust a file', logger='current', level=logging.WARNING)


def unsafe_loading_enabled() -> bool:
    """Whether :func:`set_unsafe_loading` opted this process into full unpickling."""
    return _unsafe_loading


_WANTED_PATTERNS = (
    re.compile(r'GLOBAL (\S+) was not an allowed global'),
    re.compile(r'unsupported GLOBAL (\S+)'),
    re.compile(r'unrecognized function (.+?)(?: which belongs|$)', re.M),
    re.compile(r'allowlisted via `add_safe_globals`,? but got (.+?)$', re.M),
)


def _wanted_type(message: str) -> str:
    for pattern in _WANTED_PATTERNS:
        match = pattern.search(message)
        if match:
            return match.group(1).strip()
    return 'a type outside the allow-list'


def load_checkpoint_file(filename: str, map_location='cpu', unsafe: Optional[bool] = None):
    """``torch.load`` a checkpoint file, safely unless ``unsafe``.

    Args:
        filename: a local file.
        map_location: as for ``torch.load``.
        unsafe: ``True``: full unpickling (trusted files only); ``None``: the
            process's choice (:func:`set_unsafe_loading`, default safe).

    Raises:
        FileNotFoundError: no such file.
        UnsafeCheckpointError: the file needs a type that is not allowed; the
            message names the file, the type and the opt-in.
    """
    filename = osp.expanduser(str(filename))
    if not osp.isfile(filename):
        raise FileNotFoundError(f'checkpoint not found: {filename}')
    if unsafe is None:
        unsafe = _unsafe_loading
    if unsafe:
        return torch.load(filename, map_location=map_location, weights_only=False)
    try:
        return torch.load(filename, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        wanted = _wanted_type(str(error))
        raise UnsafeCheckpointError(
            f'refusing to load checkpoint {filename}: it wants {wanted}, which safe loading '
            f"(weights_only=True, allowing tensors, numpy and mmengine's message hub) does not allow. "
            f'Nothing of it was run. If you trust this file, pass --unsafe-load (unsafe_load=True in the '
            f'Python APIs) to unpickle it in full, which can run arbitrary code.') from None


def load_from_local_safe(filename, map_location):
    """mmengine ``CheckpointLoader`` backend for local files: :func:`load_checkpoint_file`."""
    return load_checkpoint_file(filename, map_location)


# ----------------------------------------------------------------------------- strictness
@dataclass
class LoadReport:
    """How a checkpoint's state dict fits a model.

    ``mismatched`` holds ``(key, checkpoint shape, model shape)``; ``total`` is
    the number of tensors of the model's state dict.
    """
    filename: str
    total: int
    loaded: List[str] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)
    unexpected: List[str] = field(default_factory=list)
    mismatched: List[Tuple[str, tuple, tuple]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    @staticmethod
    def _listing(items, limit):
        shown = ', '.join(items[:limit]) + (', ...' if len(items) > limit else '')
        return f'{shown} ({len(items)})' if items else '0'

    def summary(self, limit: int = 3) -> str:
        """One line, e.g. ``loaded 412/420 tensors from X; missing: head.fc.weight, ... (8); unexpected: 0; ...``."""
        shapes = [f'{k} {tuple(c)} vs {tuple(m)}' for k, c, m in self.mismatched]
        return (f'loaded {len(self.loaded)}/{self.total} tensors from {self.filename}; '
                f'missing: {self._listing(self.missing, limit)}; '
                f'unexpected: {self._listing(self.unexpected, limit)}; '
                f'shape mismatch: {self._listing(shapes, limit)}')

    def error_message(self, limit: int = 5) -> str:
        """The refusal text: the first ``limit`` keys of each kind, the counts and how to proceed anyway."""
        lines = [f'checkpoint {self.filename} does not fit the model: {len(self.loaded)}/{self.total} '
                 f'tensors would be loaded']
        if self.missing:
            lines.append(f'  missing in the checkpoint ({len(self.missing)}): '
                         + ', '.join(self.missing[:limit]) + (', ...' if len(self.missing) > limit else ''))
        if self.unexpected:
            lines.append(f'  unexpected in the checkpoint ({len(self.unexpected)}): '
                         + ', '.join(self.unexpected[:limit]) + (', ...' if len(self.unexpected) > limit else ''))
        if self.mismatched:
            shown = [f'{k}: checkpoint {tuple(c)} vs model {tuple(m)}' for k, c, m in self.mismatched[:limit]]
            lines.append(f'  shape mismatch ({len(self.mismatched)}): ' + '; '.join(shown)
                         + ('; ...' if len(self.mismatched) > limit else ''))
        lines.append('  (a checkpoint of another config? pass --allow-partial, or allow_partial=True in '
                     'the Python APIs, to proceed with the unfilled tensors at their initial values)')
        return '\n'.join(lines)


def state_dict_of(checkpoint, prefix: Optional[str] = None) -> 'OrderedDict':
    """The model weights of a loaded checkpoint: its ``state_dict`` (or the mapping itself).

    A leading ``module.`` (DDP) is stripped, as mmengine does; with ``prefix``
    (e.g. ``'backbone.'``) only the keys under it are kept, without it.
    """
    if not isinstance(checkpoint, Mapping):
        raise TypeError(f'a checkpoint must be a dict of tensors or hold a `state_dict`, '
                        f'got {type(checkpoint).__name__}')
    state = checkpoint['state_dict'] if 'state_dict' in checkpoint else checkpoint
    if not isinstance(state, Mapping):
        raise TypeError(f'checkpoint `state_dict` must be a dict of tensors, got {type(state).__name__}')
    out = OrderedDict((re.sub(r'^module\.', '', k), v) for k, v in state.items())
    if prefix:
        if not prefix.endswith('.'):
            prefix += '.'
        out = OrderedDict((k[len(prefix):], v) for k, v in out.items() if k.startswith(prefix))
    return out


def compare_state_dict(model: torch.nn.Module, state_dict: Mapping, filename: str = '<state dict>') -> LoadReport:
    """Compare ``state_dict`` with ``model.state_dict()`` by key and shape (nothing is loaded)."""
    own = model.state_dict()
    report = LoadReport(filename=str(filename), total=len(own))
    for key, value in state_dict.items():
        if key not in own:
            report.unexpected.append(key)
            continue
        ckpt_shape = tuple(getattr(value, 'shape', ()))
        if ckpt_shape != tuple(own[key].shape):
            report.mismatched.append((key, ckpt_shape, tuple(own[key].shape)))
        else:
            report.loaded.append(key)
    report.missing = [k for k in own if k not in state_dict]
    return report


def check_report(report: LoadReport, allow_partial: bool) -> None:
    """Raise :class:`CheckpointMismatchError` for an incomplete fit unless ``allow_partial`` (then warn)."""
    if report.complete:
        return
    if not allow_partial:
        raise CheckpointMismatchError(report.error_message())
    print_log(f'--allow-partial: {report.summary()}', logger='current', level=logging.WARNING)


def load_model_weights(model: torch.nn.Module, filename: str, allow_partial: bool = False,
                       unsafe: Optional[bool] = None, prefix: Optional[str] = None) -> LoadReport:
    """Load a checkpoint file into ``model`` (safely, strictly by default); returns the report.

    Args:
        model: the module to fill (its ``state_dict`` keys are the reference).
        filename: a local checkpoint (a Runner checkpoint or a plain state dict).
        allow_partial: load what fits and warn instead of refusing an incomplete fit.
        unsafe: see :func:`load_checkpoint_file`.
        prefix: load only the checkpoint keys under this prefix (see :func:`state_dict_of`).

    Raises:
        UnsafeCheckpointError, CheckpointMismatchError, FileNotFoundError.
    """
    state = state_dict_of(load_checkpoint_file(filename, 'cpu', unsafe), prefix)
    report = compare_state_dict(model, state, filename)
    check_report(report, allow_partial)
    model.load_state_dict(OrderedDict((k, state[k]) for k in report.loaded), strict=False)
    return report


class StrictLoadHook(Hook):
    """Check a checkpoint the Runner loads with ``load_from`` against its model.

    Runs in ``after_load_checkpoint`` with the lowest priority, i.e. after
    ``EMAHook`` has put the weights to use into ``checkpoint['state_dict']``,
    and before they are copied into the model. Resuming is not checked.

    Args:
        strict: refuse an incomplete fit (:class:`CheckpointMismatchError`;
            ``tools/test.py``); else log :meth:`LoadReport.summary` (fine-tuning).
        allow_partial: with ``strict``, warn instead of refusing.
        filename: the name the messages give the checkpoint.
    """
    priority = 'LOWEST'

    def __init__(self, strict: bool = True, allow_partial: bool = False, filename: Optional[str] = None):
        self.strict = strict
        self.allow_partial = allow_partial
        self.filename = filename

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if runner.cfg.get('resume', False):
            return
        model = runner.model.module if hasattr(runner.model, 'module') else runner.model
        report = compare_state_dict(model, state_dict_of(checkpoint), self.filename or runner.cfg.get('load_from'))
        if self.strict:
            check_report(report, self.allow_partial)
        else:
            print_log(report.summary(), logger='current', level=logging.INFO)


class SummarizedPretrainedInit(PretrainedInit):
    """mmengine's ``PretrainedInit`` (lenient, ``prefix`` supported) that also logs a summary line.

    Registered as ``Pretrained`` in mmengine's ``WEIGHT_INITIALIZERS`` by
    :func:`register_safe_globals`, so ``init_cfg=dict(type='Pretrained', ...)``
    reports what it loaded: ``loaded 412/420 tensors from X; missing: ...``.
    """

    def __call__(self, module):
        where = 'model' if self.prefix is None else f'{self.prefix} in model'
        print_log(f'load {where} from: {self.checkpoint}', logger='current')  # as mmengine's
        checkpoint = CheckpointLoader.load_checkpoint(self.checkpoint, map_location=self.map_location,
                                                      logger='current')
        state = state_dict_of(checkpoint, self.prefix)
        if self.prefix and not state:
            raise KeyError(f'init_cfg Pretrained: no keys under prefix {self.prefix!r} in {self.checkpoint}')
        mm_load_state_dict(module, state, strict=False, logger='current')
        print_log(compare_state_dict(module, state, self.checkpoint).summary(), logger='current')
        if hasattr(module, '_params_init_info'):
            update_init_info(module, init_info=self._get_init_info())


def _register_pretrained_init() -> None:
    WEIGHT_INITIALIZERS.register_module(name='Pretrained', module=SummarizedPretrainedInit, force=True)


def exit_on_checkpoint_error(main, argv=None):
    """Run a tool's ``main(argv)``; a refused checkpoint ends it with the message on stderr and exit 1.

    Refused: :class:`UnsafeCheckpointError` (needs ``--unsafe-load``) and
    :class:`CheckpointMismatchError` (needs ``--allow-partial``). Other errors
    propagate unchanged.
    """
    import sys
    try:
        return main(argv)
    except (UnsafeCheckpointError, CheckpointMismatchError) as error:
        sys.stderr.write(f'{osp.basename(sys.argv[0]) or "tool"}: error: {error}\n')
        sys.stderr.flush()
        raise SystemExit(1) from None
