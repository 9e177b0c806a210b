"""One resumption decision for the whole job, and a check that every rank loaded the same checkpoint.

Whether a training run resumes, and from which file, is decided once, by rank 0,
and broadcast to the other ranks, so a restarted or replacement node joins the
run the others resume and never starts a fresh one. The rule (:func:`decide_resume`):

* an *elastic* job (launched by torchrun with restarts, ``TORCHELASTIC_MAX_RESTARTS``
  > 0, as ``tools/dist_train.sh`` does by default) whose work dir holds a
  checkpoint resumes from its newest complete one. The restart count of a
  process cannot tell: a replacement node's agent is new and counts 0 while the
  survivors count 1, and when the node hosting the rendezvous is lost every
  agent is new. ``--resume PATH`` and ``load_from`` apply only while the work
  dir holds no checkpoint yet; a fresh start needs a new work dir (or
  ``MAX_RESTARTS=0``);
* otherwise ``--resume`` (latest checkpoint of the work dir) and ``--resume PATH``
  resume as asked, and nothing else resumes.

Before loading, every rank checks that it sees the chosen file with the same
content (:func:`checkpoint_fingerprint`); after loading, that it stands at the
same iteration. A rank that cannot see the file, sees another file under its
name, or loaded another iteration stops the job on every rank with a
:class:`ResumeMismatchError` naming the ranks and their hosts.
"""
import hashlib
import os
import os.path as osp
import socket
import zipfile
from typing import Dict, List, NamedTuple, Optional

from mmengine.dist import all_gather_object, broadcast_object_list, get_rank, get_world_size

from polaformerpp.utils.faults import RunStoppedError

from .checkpoint_files import find_resumable_checkpoint, remove_stale_temporaries, resume_candidates


class ResumeMismatchError(RunStoppedError):
    """The ranks of a job would not resume from the same checkpoint."""


class ResumeDecision(NamedTuple):
    """What the job does at the start of training.

    ``mode`` is ``'resume'`` (from ``path``), ``'scan'`` (resume from the newest
    complete checkpoint of the work dir, which rank 0 looks up), ``'configured'``
    (start as the config says: ``load_from`` weights or from scratch); ``reason``
    says why, for the log.
    """
    mode: str
    path: Optional[str]
    reason: str


def _env_int(name: str, environ) -> int:
    value = environ.get(name, '')
    if not value.strip():
        return 0
    try:
        return int(value)
    except ValueError:
        raise ValueError(f'{name}: expected an integer, got {value!r}') from None


def elastic_restart_count(environ=None) -> int:
    """How many times this process's torchrun agent restarted its workers (0 outside torchrun).

    Raises:
        ValueError: ``TORCHELASTIC_RESTART_COUNT`` is set but is not an integer.
    """
    return _env_int('TORCHELASTIC_RESTART_COUNT', os.environ if environ is None else environ)


def elastic_max_restarts(environ=None) -> int:
    """torchrun's ``--max-restarts`` for this job (0 outside torchrun or without restarts).

    Raises:
        ValueError: ``TORCHELASTIC_MAX_RESTARTS`` is set but is not an integer.
    """
    return _env_int('TORCHELASTIC_MAX_RESTARTS', os.environ if environ is None else environ)


def decide_resume(resume: bool, load_from: Optional[str], work_dir: str, environ=None) -> ResumeDecision:
    """The job's resumption rule (see the module), from the configuration and the work dir.

    Args:
        resume: ``cfg.resume`` (``--resume`` given).
        load_from: ``cfg.load_from`` (``--resume PATH``'s path, or fine-tuning weights).
        work_dir: the run's work dir.
        environ: the variables to read (``os.environ`` by default).
    """
    environ = os.environ if environ is None else environ
    max_restarts = elastic_max_restarts(environ)
    if max_restarts > 0 and resume_candidates(work_dir):
        return ResumeDecision(
            'scan', None,
            f'elastic job (torchrun --max-restarts={max_restarts}, this agent\'s restart '
            f'{elastic_restart_count(environ)}): resuming from the latest checkpoint of {work_dir}'
            + ('' if not load_from else f' instead of {load_from}'))
    if resume and load_from is None:
        return ResumeDecision('scan', None, f'--resume: the latest checkpoint of {work_dir}')
    if resume:
        return ResumeDecision('resume', load_from, f'--resume {load_from}')
    return ResumeDecision('configured', None, 'starting as configured')


def checkpoint_fingerprint(path: str) -> Dict:
    """What identifies the content of checkpoint ``path``: its size and a digest.

    The digest hashes the names (below the archive's top folder, which is named
    after the file), sizes and CRC-32s of the members of the ``torch.save`` zip
    archive, read from its directory, so it costs no more than opening the file;
    any other file is hashed whole. (Every ``torch.save`` writes a serialization
    id of its own, so two saves of the same tensors differ; copies of one file do not.)
    """
    digest = hashlib.sha256()
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                name = info.filename.split('/', 1)[-1]
                digest.update(f'{name}\0{info.file_size}\0{info.CRC}\n'.encode())
    else:
        with open(path, 'rb') as f:
            for block in iter(lambda: f.read(1 << 20), b''):
                digest.update(block)
    return dict(size=osp.getsize(path), digest=digest.hexdigest()[:16])


def _who(record: Dict) -> str:
    return f'rank {record["rank"]} (host {record["host"]})'


def decide_for_job(decide, work_dir: str) -> ResumeDecision:
    """Rank 0 runs ``decide()`` and looks the checkpoint up; every rank gets its decision (collective).

    A ``'scan'`` decision is resolved on rank 0 (stale temporaries removed, the
    newest complete checkpoint found) into ``'resume'`` or, with no checkpoint,
    ``'configured'``. An error on rank 0 is raised on every rank.
    """
    box: List = [None]
    failure = None
    if get_rank() == 0:
        try:
            box[0] = ('ok', tuple(_resolve(decide(), work_dir)))
        except Exception as error:  # noqa: BLE001 (passed on to the other ranks, then raised here)
            failure = error
            box[0] = ('error', f'{type(error).__name__}: {error}')
    if get_world_size() > 1:
        broadcast_object_list(box, src=0)
    if failure is not None:
        raise failure
    status, value = box[0]
    if status == 'error':
        raise ResumeMismatchError(f'rank 0 could not decide how to resume: {value}')
    return ResumeDecision(*value)


def _resolve(decision: ResumeDecision, work_dir: str) -> ResumeDecision:
    """A ``'scan'`` decision turned into ``'resume'`` from the work dir's newest complete checkpoint
    (or ``'configured'`` when there is none); stale temporary files are removed first."""
    if decision.mode != 'scan':
        return decision
    removed = ''.join(f'\nremoved {p}, left by an interrupted checkpoint write'
                      for p in remove_stale_temporaries(work_dir))
    path, _ = find_resumable_checkpoint(work_dir)
    if path is None:
        return ResumeDecision('configured', None, f'{decision.reason}: none yet, training from the start{removed}')
    return ResumeDecision('resume', path, decision.reason + removed)


def check_same_checkpoint(path: str) -> Dict:
    """Every rank sees ``path`` with the same content (collective); returns the fingerprint.

    Raises:
        ResumeMismatchError: on every rank, when a rank cannot read the file or
            reads a different one (naming the ranks and hosts).
    """
    record = dict(rank=get_rank(), host=socket.gethostname(), fingerprint=None, problem=None)
    try:
        record['fingerprint'] = checkpoint_fingerprint(path)
    except OSError as error:
        record['problem'] = f'{type(error).__name__}: {error.strerror or error}'
    except zipfile.BadZipFile as error:
        record['problem'] = f'unreadable archive ({error})'
    records = all_gather_object(record) if get_world_size() > 1 else [record]
    missing = [r for r in records if r['problem'] is not None]
    if missing:
        ranks = '; '.join(f'{_who(r)}: {r["problem"]}' for r in missing)
        raise ResumeMismatchError(
            f'the job resumes from {path}, which {len(missing)} of {len(records)} ranks cannot read ({ranks}). '
            'The work dir is probably not shared between the nodes: put it on a file system that every node '
            'mounts at the same path (--work-dir)')
    reference = records[0]['fingerprint']
    differing = [r for r in records if r['fingerprint'] != reference]
    if differing:
        ranks = '; '.join(f'{_who(r)}: {r["fingerprint"]}' for r in differing)
        raise ResumeMismatchError(
            f'the ranks see different files at {path} (rank 0: {reference}; {ranks}). Each node probably '
            'has a work dir of its own: put it on a file system that every node mounts at the same path')
    return reference


def check_same_position(path: str, fingerprint: Dict, iteration: int, epoch: int) -> None:
    """After loading: every rank stands at the same iteration and epoch of the same file (collective).

    Raises:
        ResumeMismatchError: on every rank, naming the ranks that differ from rank 0.
    """
    record = dict(rank=get_rank(), host=socket.gethostname(), iter=int(iteration), epoch=int(epoch),
                  fingerprint=fingerprint)
    records = all_gather_object(record) if get_world_size() > 1 else [record]
    keys = ('iter', 'epoch', 'fingerprint')
    differing = [r for r in records if any(r[k] != records[0][k] for k in keys)]
    if differing:
        ranks = '; '.join(f'{_who(r)}: iter {r["iter"]}, epoch {r["epoch"]}, {r["fingerprint"]}' for r in differing)
        raise ResumeMismatchError(
            f'the ranks resumed from {path} at different points (rank 0: iter {records[0]["iter"]}, epoch '
            f'{records[0]["epoch"]}, {records[0]["fingerprint"]}; {ranks})')
