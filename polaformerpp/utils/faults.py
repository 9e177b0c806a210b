"""Runs that stop with a message naming what broke, instead of a traceback through mmengine.

:class:`RunStoppedError` is the family of errors whose message is the whole
explanation (a checkpoint that cannot be written, ranks that would resume from
different checkpoints, a lost peer). :func:`run_tool_main` runs a tool's
``main``: such an error, a refused checkpoint, and the failed collective of a
distributed run (explained by :mod:`polaformerpp.utils.peers`: which rank
stopped answering) end the tool with one ``tool: error: ...`` line on stderr,
the same line in the run's log file, and, under torchrun, in the worker's error
file, which torchrun's failure summary prints as the rank's traceback. The exit
status is 1, so torchrun restarts the group where ``--max-restarts`` allows.
"""
import json
import logging
import os
import os.path as osp
import sys
import time
from typing import Callable, Optional


class RunStoppedError(RuntimeError):
    """A run stopped for a reason that its message names in full (no traceback needed)."""


def human_bytes(count: float) -> str:
    """``1536`` -> ``'1.5 KiB'`` (binary units)."""
    for unit in ('B', 'KiB', 'MiB', 'GiB', 'TiB'):
        if abs(count) < 1024 or unit == 'TiB':
            return f'{count:.0f} {unit}' if unit == 'B' else f'{count:.1f} {unit}'
        count /= 1024
    return f'{count:.1f} TiB'  # pragma: no cover


def record_for_torchrun(message: str) -> None:
    """Write ``message`` as this worker's error in torchrun's error file (``TORCHELASTIC_ERROR_FILE``).

    torchrun prints the file's ``py_callstack`` as the rank's ``traceback`` in
    its failure summary. Outside torchrun, or when the file is already written
    (by an earlier error of this process), nothing happens.
    """
    path = os.environ.get('TORCHELASTIC_ERROR_FILE')
    if not path or osp.exists(path):
        return
    data = dict(message=dict(message=message, extraInfo=dict(py_callstack=message, timestamp=str(int(time.time())))))
    try:
        with open(path, 'w') as f:
            json.dump(data, f)
    except OSError:
        pass


def _log_to_run_files(message: str) -> None:
    """Append ``message`` as an ERROR line to the log files of the current mmengine logger, if any."""
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    record = logger.makeRecord(logger.name, logging.ERROR, __file__, 0, message, None, None)
    for handler in logger.handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def stop_tool(message: str, tool: Optional[str] = None) -> None:
    """End the tool: ``tool: error: message`` on stderr, in the run's log file and for torchrun; exit 1."""
    tool = tool or osp.basename(sys.argv[0]) or 'tool'
    line = f'{tool}: error: {message}'
    _log_to_run_files(line)
    record_for_torchrun(line)
    sys.stdout.flush()
    sys.stderr.write(line + '\n')
    sys.stderr.flush()
    if _in_process_group():
        # the group's C++ threads may abort the interpreter's teardown ("terminate called ...")
        logging.shutdown()
        os._exit(1)
    raise SystemExit(1)


def _in_process_group() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return False
    return dist.is_available() and dist.is_initialized()


def run_tool_main(main: Callable, argv=None):
    """Run a tool's ``main(argv)``, ending with :func:`stop_tool` on the errors the module lists."""
    from .checkpoint import exit_on_checkpoint_error
    from .peers import explain_collective_failure
    try:
        return exit_on_checkpoint_error(main, argv)
    except RunStoppedError as error:
        stop_tool(str(error))
    except Exception as error:
        explanation = explain_collective_failure(error)
        if explanation is None:
            raise
        stop_tool(explanation)
