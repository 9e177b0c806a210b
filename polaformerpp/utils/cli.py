"""Argument checks shared by the command-line tools.

Two kinds of check, both ending on the command line the way argparse ends a
bad argument (a message naming the argument on stderr, exit code 2):

* argparse ``type=`` functions (:func:`positive_int`, :func:`non_negative_int`,
  :func:`positive_float`, :func:`non_negative_float`, :func:`positive_multiple_of`,
  :func:`torch_device`)
  reject a value while parsing: ``prog: error: argument --repeat: must be a
  positive integer, got 0``;
* checks that need several values, the file system or a built model raise
  :class:`ArgumentCheckError` (a ``ValueError``; :class:`MissingPathError`
  is also a ``FileNotFoundError``), so that the tools' functions stay usable
  from Python. Inside ``parse_args`` wrap them in :func:`parser_errors`
  (argparse's own ``parser.error``); around a tool's ``main`` use
  :func:`run_cli`.
"""
import argparse
import os.path as osp
import sys
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, Sequence, Tuple

__all__ = ['ArgumentCheckError', 'MissingPathError', 'positive_int', 'non_negative_int', 'positive_float',
           'non_negative_float', 'positive_multiple_of', 'torch_device', 'image_shape', 'existing_file',
           'existing_path', 'parser_errors', 'run_cli']


class ArgumentCheckError(ValueError):
    """An impossible command-line argument; the message names the argument (e.g. ``--steps``)."""


class MissingPathError(ArgumentCheckError, FileNotFoundError):
    """A command-line argument naming a file or folder that does not exist."""


# --------------------------------------------------------------------------- argparse type= functions
def _number(text: str, kind: type, what: str):
    try:
        return kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f'must be {what}, got {text!r}') from None


def positive_int(text: str) -> int:
    """argparse type: an integer ``>= 1``."""
    value = _number(text, int, 'a positive integer')
    if value < 1:
        raise argparse.ArgumentTypeError(f'must be a positive integer, got {value}')
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer ``>= 0``."""
    value = _number(text, int, 'an integer >= 0')
    if value < 0:
        raise argparse.ArgumentTypeError(f'must be an integer >= 0, got {value}')
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number ``> 0``."""
    value = _number(text, float, 'a positive number')
    if not 0 < value < float('inf'):
        raise argparse.ArgumentTypeError(f'must be a positive number, got {value}')
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a finite number ``>= 0``."""
    value = _number(text, float, 'a number >= 0')
    if not 0 <= value < float('inf'):
        raise argparse.ArgumentTypeError(f'must be a number >= 0, got {value}')
    return value


def positive_multiple_of(step: int, why: str = '') -> Callable[[str], int]:
    """argparse type: a positive integer divisible by ``step`` (``why`` is added to the message)."""
    if step < 1:
        raise ValueError(f'step must be >= 1, got {step}')

    def parse(text: str) -> int:
        value = _number(text, int, f'a positive multiple of {step}')
        if value < 1 or value % step:
            reason = f' ({why})' if why else ''
            raise argparse.ArgumentTypeError(f'must be a positive multiple of {step}{reason}, got {value}')
        return value

    parse.__name__ = f'positive_multiple_of_{step}'
    return parse


def torch_device(text: str) -> str:
    """argparse type: a device torch understands (``cpu``, ``cuda``, ``cuda:1``, ...); CUDA must be present."""
    import torch
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"must be a torch device such as 'cpu' or 'cuda:0', got {text!r}") \
            from None
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f'{text}: CUDA is not available on this machine')
    return text


# --------------------------------------------------------------------------- checks after parsing
def image_shape(values: Optional[Sequence[int]], option: str = '--shape') -> Optional[Tuple[int, int]]:
    """``H W`` or one size (a square) -> ``(H, W)`` of positive integers; ``None`` stays ``None``.

    Raises:
        ArgumentCheckError: for another count of values or a value ``< 1``.
    """
    if values is None:
        return None
    values = list(values)
    if len(values) not in (1, 2) or any(int(v) != v or v < 1 for v in values):
        raise ArgumentCheckError(f'{option} takes H W or one size (positive integers), got '
                                 f'{" ".join(str(v) for v in values)}')
    if len(values) == 1:
        values = values * 2
    return int(values[0]), int(values[1])


def existing_file(path: str, option: str) -> str:
    """``path`` if it is a file, else :class:`MissingPathError` naming ``option``."""
    if osp.isdir(path):
        raise MissingPathError(f'{option}: {path} is a folder, expected a file')
    if not osp.isfile(path):
        raise MissingPathError(f'{option}: {path} not found')
    return path


def existing_path(path: str, option: str) -> str:
    """``path`` if it is a file or a folder, else :class:`MissingPathError` naming ``option``."""
    if not osp.exists(path):
        raise MissingPathError(f'{option}: {path} not found')
    return path


@contextmanager
def parser_errors(parser: argparse.ArgumentParser) -> Iterator[None]:
    """Report an :class:`ArgumentCheckError` raised inside as ``parser.error`` (usage, exit code 2)."""
    try:
        yield
    except ArgumentCheckError as exc:
        parser.error(str(exc))


def run_cli(main: Callable, argv: Optional[Sequence[str]] = None, prog: Optional[str] = None):
    """``main(argv)``; an :class:`ArgumentCheckError` ends the program like argparse (stderr, exit 2).

    Args:
        main: the tool's entry point, taking ``argv`` (``None``: ``sys.argv[1:]``).
        prog: the program name in the message (default ``basename(sys.argv[0])``).
    """
    try:
        return main(argv)
    except ArgumentCheckError as exc:
        name = prog or osp.basename(sys.argv[0]) or 'tool'
        sys.stderr.write(f'{name}: error: {exc}\n')
        sys.stderr.flush()
        raise SystemExit(2) from None
