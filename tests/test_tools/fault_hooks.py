"""Test-only hooks that make a training process fail as a lost or frozen node would.

Loaded by the multi-node fault tests through a config's ``custom_imports`` (this
folder is put on the child processes' ``PYTHONPATH``). Each acts once per job:
the first process that reaches ``at_iter`` (0-based ``runner.iter``) with the
hook's environment variable set writes the marker file that variable names
(``rank pid``) and then

* ``WaitToBeKilledHook``: sleeps until the test kills its node (the whole
  process tree of its torchrun agent) with SIGKILL;
* ``FreezeHook`` (only on rank ``rank``): stops itself with SIGSTOP, a frozen
  process that no longer answers (its heartbeat thread stops too).

A process that finds the marker already written does nothing, so a restarted
or replacement worker trains on.
"""
import os
import signal
import time

from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


def _first_time(variable):
    marker = os.environ.get(variable)
    if not marker or os.path.exists(marker):
        return False
    tmp = f'{marker}.tmp'
    with open(tmp, 'w') as f:
        f.write(f'{get_rank()} {os.getpid()}')
    os.replace(tmp, marker)
    return True


@HOOKS.register_module()
class WaitToBeKilledHook(Hook):
    priority = 'LOWEST'

    def __init__(self, at_iter):
        self.at_iter = at_iter

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.iter == self.at_iter and _first_time('WAIT_TO_BE_KILLED_MARKER'):
            time.sleep(600)


@HOOKS.register_module()
class FreezeHook(Hook):
    priority = 'LOWEST'

    def __init__(self, rank, at_iter):
        self.rank, self.at_iter = rank, at_iter

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if get_rank() == self.rank and runner.iter == self.at_iter and _first_time('FREEZE_MARKER'):
            os.kill(os.getpid(), signal.SIGSTOP)
