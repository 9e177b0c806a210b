"""Which rank stopped answering: heartbeats of a distributed run's ranks, read when a collective fails.

A failed collective names no rank: gloo says ``Connection closed by peer
[10.0.0.2]:31126`` or ``Timed out waiting 600000ms for recv operation``, and
torchrun's summary names the first rank that *exited*, which is a survivor.
While a distributed run lasts, each rank's :class:`PeerWatch` thread writes a
heartbeat (a counter, its host, pid and the last hook point it passed) to the
job's TCP store (``MASTER_ADDR:MASTER_PORT``) every ``period`` seconds. When a
collective fails, :func:`explain_collective_failure` reads the heartbeats twice,
``2.5 x period`` apart: a rank whose counter did not move has stopped answering
(its process is frozen or gone, or its node is lost); a store that does not
answer means the process or node hosting it (rank 0's, or node 0's agent) is
lost; ranks that all answer but stand at different hook points are out of step.
"""
import json
import logging
import os
import socket
import threading
import time
import uuid
from datetime import timedelta
from typing import Dict, List, Optional

#: ``str(error)`` fragments of the failures of gloo / NCCL collectives and of the store (gloo's timeout reads
#: either ``[.../gloo/...] Timed out waiting ...`` or ``Application timeout caused pair closure``, by where it
#: caught the wait)
_COLLECTIVE_FAILURE_TEXTS = ('gloo', 'nccl', 'connection closed by peer', 'connection reset by peer',
                             'collective operation timeout', 'timeout caused pair closure')

_WATCH: List[Optional['PeerWatch']] = [None]


def heartbeat_period(timeout: float) -> float:
    """Seconds between heartbeats for a collective timeout of ``timeout`` seconds (0.5 to 5)."""
    return min(5.0, max(0.5, float(timeout) / 60))


class PeerWatch:
    """This rank's heartbeat thread and the reader of all ranks' heartbeats.

    Args:
        store: a ``torch.distributed.Store`` client every rank reaches.
        prefix (str): the key prefix of this attempt (the same on every rank).
        rank, world_size (int): this process's place in the default group.
        period (float): seconds between heartbeats.
        address (str): ``host:port`` of the store, for messages.
    """

    def __init__(self, store, prefix: str, rank: int, world_size: int, period: float, address: str):
        self.store, self.prefix, self.rank, self.world_size = store, prefix, rank, world_size
        self.period, self.address = period, address
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.stage = 'start-up'
        self._beat = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name='polaformerpp-peer-watch', daemon=True)

    def _key(self, rank: int) -> str:
        return f'{self.prefix}/{rank}'

    def beat(self) -> None:
        """Write one heartbeat now."""
        with self._lock:
            self._beat += 1
            record = dict(beat=self._beat, host=self.host, pid=self.pid, stage=self.stage)
            self.store.set(self._key(self.rank), json.dumps(record))

    def _run(self) -> None:
        while True:
            try:
                self.beat()
            except Exception:  # noqa: BLE001 (the store is gone: its host stopped; nothing to report to)
                return
            if self._stop.wait(self.period):
                return

    def start(self) -> 'PeerWatch':
        self.beat()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=2 * self.period + 5)

    def read(self) -> Dict[int, Optional[dict]]:
        """Every rank's latest heartbeat (None for a rank that never wrote one); raises if the store is gone."""
        records = {}
        for rank in range(self.world_size):
            key = self._key(rank)
            records[rank] = json.loads(self.store.get(key)) if self.store.check([key]) else None
        return records

    def explain(self, error: BaseException) -> Optional[str]:
        """Why a collective of this rank failed with ``error``, naming the ranks at fault; None when all
        ranks answer at the same hook point (nothing distributed to explain)."""
        failed = _first_line(error)
        here = f'rank {self.rank} (host {self.host}) stopped at {self.stage} when its collective failed: {failed}'
        wait = 2.5 * self.period
        try:
            first = self.read()
            time.sleep(wait)
            second = self.read()
        except Exception as store_error:  # noqa: BLE001
            return (f'lost peer: the job\'s store at {self.address} does not answer ({_first_line(store_error)}): '
                    'the process or node hosting it (rank 0, or node 0\'s torchrun agent) is probably lost; '
                    + here)
        silent, stages = [], {}
        for rank in range(self.world_size):
            if rank == self.rank:
                continue
            before, after = first[rank], second[rank]
            if after is None:
                silent.append(f'rank {rank} (never sent a heartbeat)')
            elif before is not None and before['beat'] == after['beat']:
                silent.append(f'rank {rank} (host {after["host"]}, pid {after["pid"]}, last heartbeat at '
                              f'{after["stage"]})')
            else:
                stages[rank] = after['stage']
        if silent:
            return (f'lost peer: {", ".join(silent)} stopped answering (no heartbeat in {wait:.1f} s: the '
                    f'process is frozen or gone, or its node is lost); ' + here)
        if any(stage != self.stage for stage in stages.values()):
            listing = ', '.join(f'rank {r} at {s}' for r, s in sorted(stages.items()))
            return f'ranks out of step: every rank answers, but {listing}; ' + here
        return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f'{type(error).__name__}: {text[0] if text else ""}'.rstrip(': ')


def is_collective_failure(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) is a failed gloo / NCCL collective or store call."""
    import torch.distributed as dist
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, getattr(dist, 'DistError', ())):
            return True
        text = str(error).lower()
        if isinstance(error, (RuntimeError, OSError)) and any(t in text for t in _COLLECTIVE_FAILURE_TEXTS):
            return True
        error = error.__cause__ or error.__context__
    return False


def start_peer_watch(timeout: float) -> Optional[PeerWatch]:
    """Start this rank's :class:`PeerWatch` (a collective: every rank of the default group calls it).

    Does nothing (returns None) outside a distributed run of more than one
    process, or without ``MASTER_ADDR``/``MASTER_PORT`` (e.g. an MPI launch).
    """
    import torch.distributed as dist
    from mmengine.dist import broadcast_object_list
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    host, port = os.environ.get('MASTER_ADDR'), os.environ.get('MASTER_PORT')
    if not host or not port:
        return None
    stop_peer_watch()
    token = [uuid.uuid4().hex[:12]]
    broadcast_object_list(token, src=0)
    period = heartbeat_period(timeout)
    try:
        store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=max(10.0, 2 * period)),
                              wait_for_workers=False)
        _WATCH[0] = PeerWatch(store, f'polaformerpp/peers/{token[0]}', dist.get_rank(), dist.get_world_size(),
                              period, f'{host}:{port}').start()
    except Exception as error:  # noqa: BLE001 (the run goes on; only the explanation of a failure is lost)
        from mmengine.logging import print_log
        print_log(f'no heartbeat for this rank: the store at {host}:{port} did not take one ({error}); a failed '
                  'collective will not say which rank stopped answering', logger='current', level=logging.WARNING)
        return None
    return _WATCH[0]


def stop_peer_watch() -> None:
    """Stop this rank's heartbeat thread (at the end of a run)."""
    watch, _WATCH[0] = _WATCH[0], None
    if watch is not None:
        watch.stop()


def set_stage(stage: str) -> None:
    """Record where this rank is (its heartbeats carry it): e.g. ``'before_train_iter (iteration 12)'``."""
    if _WATCH[0] is not None:
        _WATCH[0].stage = stage


def explain_collective_failure(error: BaseException) -> Optional[str]:
    """The lost-peer explanation of ``error`` (see the module), or None when it is not a failed
    collective of a watched run or every rank answers at the same point."""
    watch = _WATCH[0]
    if watch is None or not is_collective_failure(error):
        return None
    return watch.explain(error)
