"""Checkpoint files on a local disk: atomic writes, readability checks, the resume candidates.

A checkpoint (or the ``last_checkpoint`` pointer) is first written to a hidden
temporary file in the same folder, ``.<name>.tmp-<pid>``, flushed to disk, then
renamed over the final name with :func:`os.replace`, so a reader sees either
the previous file or the complete new one, never a partial one. A process killed
while writing leaves only the temporary file, which :func:`remove_stale_temporaries`
clears.
"""
import glob
import logging
import os
import os.path as osp
import re
import shutil
import zipfile
from typing import List, Optional, Tuple

from mmengine.logging import print_log

from polaformerpp.utils.faults import RunStoppedError, human_bytes

#: the file mmengine's CheckpointHook writes in the work dir: the path of the newest checkpoint
POINTER_NAME = 'last_checkpoint'
_TEMP_RE = re.compile(r'^\..+\.tmp-\d+$')


class CheckpointSaveError(RunStoppedError):
    """A checkpoint (or the ``last_checkpoint`` pointer) could not be written; the message names the
    file, the error and the free space of its folder."""


def save_failure(path: str, error: BaseException, what: str = 'the checkpoint') -> CheckpointSaveError:
    """The :class:`CheckpointSaveError` for writing ``path`` failing with ``error``.

    Example message: ``could not write the checkpoint work/epoch_2.pth: [Errno 28] No space
    left on device; its folder work has 12.0 KiB free of 24.0 MiB (the newest checkpoint there,
    epoch_1.pth, takes 9.6 MiB); the checkpoints already written and last_checkpoint are
    unchanged``.
    """
    folder = osp.dirname(osp.abspath(path))
    reason = f'[Errno {error.errno}] {error.strerror}' if getattr(error, 'strerror', None) else str(error)
    try:
        usage = shutil.disk_usage(folder)
        space = f'its folder {folder} has {human_bytes(usage.free)} free of {human_bytes(usage.total)}'
    except OSError as usage_error:
        space = f'the free space of its folder {folder} is unknown ({usage_error.strerror or usage_error})'
    others = [p for p in glob.glob(osp.join(glob.escape(folder), '*.pth')) if osp.isfile(p)]
    if others:
        newest = max(others, key=lambda p: (osp.getmtime(p), p))
        space += f' (the newest checkpoint there, {osp.basename(newest)}, takes {human_bytes(osp.getsize(newest))})'
    return CheckpointSaveError(f'could not write {what} {path}: {reason}; {space}; the checkpoints already '
                               f'written and {POINTER_NAME} are unchanged')


def temporary_path(path: str) -> str:
    """The temporary file next to ``path`` that an atomic write of ``path`` goes through."""
    return osp.join(osp.dirname(path), f'.{osp.basename(path)}.tmp-{os.getpid()}')


def fsync_path(path: str) -> None:
    """Flush a written file (or a folder's entries) to the disk; ignored where unsupported."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def commit_temporary(tmp: str, path: str) -> None:
    """Flush ``tmp`` and rename it over ``path`` atomically (same folder)."""
    fsync_path(tmp)
    os.replace(tmp, path)
    fsync_path(osp.dirname(path) or '.')


def discard(path: str) -> None:
    """Remove ``path`` if it exists (a failed write's temporary file)."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` so that ``path`` never holds a partial text."""
    tmp = temporary_path(path)
    try:
        with open(tmp, 'w') as f:
            f.write(text)
        commit_temporary(tmp, path)
    except BaseException:
        discard(tmp)
        raise


def remove_stale_temporaries(folder: str) -> List[str]:
    """Delete the temporary files that interrupted atomic writes left in ``folder``; returns them."""
    removed = []
    for path in glob.glob(osp.join(glob.escape(folder), '.*')):
        if _TEMP_RE.match(osp.basename(path)) and osp.isfile(path):
            discard(path)
            removed.append(path)
    return removed


def checkpoint_problem(path: str) -> Optional[str]:
    """Why ``path`` cannot be a complete checkpoint, or None when it reads back whole.

    ``torch.save`` writes a zip archive; the check reads the archive's directory
    and the CRC of every member (no unpickling), which finds truncated and
    overwritten files.
    """
    if not osp.isfile(path):
        return 'the file does not exist'
    if osp.getsize(path) == 0:
        return 'the file is empty'
    if not zipfile.is_zipfile(path):
        return 'not a complete torch.save archive (no zip directory at its end: truncated?)'
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, RuntimeError) as err:
        return f'unreadable archive ({err})'
    if bad is not None:
        return f'the archive member {bad!r} is corrupt'
    return None


def read_pointer(work_dir: str) -> Optional[str]:
    """The checkpoint path that ``work_dir/last_checkpoint`` names, or None (missing or empty)."""
    pointer = osp.join(work_dir, POINTER_NAME)
    if not osp.isfile(pointer):
        return None
    with open(pointer) as f:
        target = f.read().strip()
    if not target:
        print_log(f'{pointer} is empty; looking for checkpoints in {work_dir}',
                  logger='current', level=logging.WARNING)
        return None
    return target


def resume_candidates(work_dir: str) -> List[str]:
    """Checkpoints to resume ``work_dir`` from, best first.

    The one ``last_checkpoint`` names, then the other ``*.pth`` files of the work
    dir (not ``best_*``, which hold no optimizer state), newest first.
    """
    candidates = []
    target = read_pointer(work_dir)
    if target is not None:
        candidates.append(target)
    others = [p for p in glob.glob(osp.join(glob.escape(work_dir), '*.pth'))
              if not osp.basename(p).startswith('best') and osp.isfile(p)]
    others.sort(key=lambda p: (osp.getmtime(p), p), reverse=True)
    for path in others:
        if not any(osp.abspath(path) == osp.abspath(c) for c in candidates):
            candidates.append(path)
    return candidates


def find_resumable_checkpoint(work_dir: str) -> Tuple[Optional[str], List[Tuple[str, str]]]:
    """The newest complete checkpoint of ``work_dir`` and the skipped ones.

    Returns:
        (path or None, [(skipped path, reason), ...]). Each skipped file is also
        logged as a warning naming it.

    Raises:
        RuntimeError: there are checkpoints but none of them reads back whole.
    """
    skipped = []
    candidates = resume_candidates(work_dir)
    for path in candidates:
        problem = checkpoint_problem(path)
        if problem is None:
            return path, skipped
        skipped.append((path, problem))
        print_log(f'Skipping the checkpoint {path} for resuming: {problem}; falling back to the '
                  'previous checkpoint', logger='current', level=logging.WARNING)
    if candidates:
        listing = '\n'.join(f'  {p}: {why}' for p, why in skipped)
        raise RuntimeError(f'--resume: no readable checkpoint in {work_dir}:\n{listing}')
    return None, skipped
