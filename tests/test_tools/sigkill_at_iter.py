"""A test-only hook that SIGKILLs its own process at a chosen training iteration.

Loaded by the exact-resume tests through a config's ``custom_imports`` (the
test folder is put on ``PYTHONPATH`` of the child process). The kill is a real
``kill -9``: no Python cleanup, no flushing, no atexit.

``SigkillAtIterHook(at_iter=N, stage='before')`` kills before iteration N
(0-based ``runner.iter == N``) starts; ``stage='after'`` kills at the very end
of iteration N's ``after_train_iter`` (priority LOWEST: after CheckpointHook
has written ``iter_{N+1}.pth``). ``at_iter`` is a list to kill at the first
of those iterations that a run reaches beyond where it resumed.
"""
import os
import signal

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class SigkillAtIterHook(Hook):
    priority = 'LOWEST'

    def __init__(self, at_iter, stage='before'):
        if stage not in ('before', 'after'):
            raise ValueError(f"stage: expected 'before' or 'after', got {stage!r}")
        self.at_iter = int(at_iter)
        self.stage = stage

    def _maybe_kill(self, runner, stage):
        if stage == self.stage and runner.iter == self.at_iter:
            os.kill(os.getpid(), signal.SIGKILL)

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self._maybe_kill(runner, 'before')

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self._maybe_kill(runner, 'after')
