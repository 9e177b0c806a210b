"""Progress bars for the long loops of the tools (sampling, FID, benchmarks, analyses).

A bar is mmengine's :class:`~mmengine.utils.ProgressBar` written to **stderr**
(stdout carries the tables and JSON the tools print), and only when that
stream is a terminal: logs, pipes and CI get no bar output at all. The
environment variable ``POLAPP_NO_PROGRESS=1`` (or a tool's ``--no-progress``)
turns the bars off even on a terminal.

Example::

    from polaformerpp.utils.progress import progress_from_args, track

    for batch in track(batches, desc='sampling', enabled=progress_from_args(args)):
        ...
"""
import os
import sys
from typing import Iterable, Iterator, Optional, TextIO, TypeVar

from mmengine.utils import ProgressBar as MMEngineProgressBar

__all__ = ['NO_PROGRESS_ENV', 'progress_enabled', 'ProgressBar', 'track', 'add_progress_argument',
           'progress_from_args']

#: set to a non-empty value other than ``0`` to turn every bar off
NO_PROGRESS_ENV = 'POLAPP_NO_PROGRESS'

T = TypeVar('T')


def _env_disables() -> bool:
    return os.environ.get(NO_PROGRESS_ENV, '').strip().lower() not in ('', '0', 'false', 'no')


def _is_terminal(stream) -> bool:
    isatty = getattr(stream, 'isatty', None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (ValueError, OSError):  # a closed stream
        return False


def progress_enabled(enabled: Optional[bool] = None, stream: Optional[TextIO] = None) -> bool:
    """Whether a bar is drawn.

    Args:
        enabled: ``False`` never, ``True`` always (the caller's explicit
            choice), ``None`` (automatic): when ``stream`` is a terminal and
            ``POLAPP_NO_PROGRESS`` is not set.
        stream: where the bar would go (default ``sys.stderr``).
    """
    if enabled is not None:
        return bool(enabled)
    if _env_disables():
        return False
    return _is_terminal(sys.stderr if stream is None else stream)


class ProgressBar:
    """A bar over ``total`` tasks that draws nothing when disabled (see :func:`progress_enabled`).

    Use as a context manager (or call :meth:`close`): the finished bar's line
    is ended with a newline.

    Args:
        total (int): number of tasks; ``<= 0`` draws nothing.
        desc (str, optional): a title written on its own line above the bar.
        enabled (bool, optional): ``True``/``False`` force, ``None`` automatic.
        stream: the output stream (default ``sys.stderr``, read when the bar is made).
    """

    def __init__(self, total: int, desc: Optional[str] = None, enabled: Optional[bool] = None,
                 stream: Optional[TextIO] = None):
        self.stream = sys.stderr if stream is None else stream
        self.total = int(total)
        self.active = self.total > 0 and progress_enabled(enabled, self.stream)
        self.completed = 0
        self._bar = None
        if self.active:
            if desc:
                self.stream.write(f'{desc}\n')
            self._bar = MMEngineProgressBar(self.total, file=self.stream)

    def update(self, num: int = 1) -> None:
        """Mark ``num`` more tasks done (``num <= 0`` is ignored)."""
        if num <= 0:
            return
        self.completed += num
        if self._bar is not None:
            self._bar.update(num)

    def close(self) -> None:
        """End the bar's line (once)."""
        if self._bar is not None:
            self.stream.write('\n')
            self.stream.flush()
            self._bar = None

    def __enter__(self) -> 'ProgressBar':
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def track(iterable: Iterable[T], total: Optional[int] = None, desc: Optional[str] = None,
          enabled: Optional[bool] = None, stream: Optional[TextIO] = None) -> Iterator[T]:
    """Yield the items of ``iterable``, advancing a :class:`ProgressBar` by one after each.

    ``total`` defaults to ``len(iterable)``; an iterable without a length and
    no ``total`` gets no bar.
    """
    if total is None:
        total = len(iterable) if hasattr(iterable, '__len__') else 0
    with ProgressBar(total, desc, enabled, stream) as bar:
        for item in iterable:
            yield item
            bar.update()


def add_progress_argument(parser) -> None:
    """Add ``--no-progress`` to an :class:`argparse.ArgumentParser` (``args.no_progress``).

    Pass :func:`progress_from_args` of the parsed arguments to the bars as ``enabled``.
    """
    parser.add_argument('--no-progress', action='store_true',
                        help=f'no progress bars (they go to stderr, only on a terminal; '
                             f'{NO_PROGRESS_ENV}=1 does the same)')


def progress_from_args(args) -> Optional[bool]:
    """``enabled`` for the bars from parsed arguments: ``False`` with ``--no-progress``, else automatic."""
    return False if getattr(args, 'no_progress', False) else None
