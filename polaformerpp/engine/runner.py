"""``PolaRunner``: mmengine's Runner with exact resumption, atomic checkpoints and restarts.

Select it in a config with ``runner_type = 'PolaRunner'`` (and
``'polaformerpp.engine'`` in ``custom_imports``). Compared with
``mmengine.runner.Runner``:

* the train loop is :class:`~polaformerpp.engine.loops.ResumableEpochBasedTrainLoop`
  / :class:`~polaformerpp.engine.loops.ResumableIterBasedTrainLoop` in place of
  mmengine's two loops, and the ``checkpoint`` default hook is
  :class:`~polaformerpp.engine.hooks.AtomicCheckpointHook` in place of
  ``CheckpointHook``: a resumed run continues from the exact batch and random
  state of its checkpoint (bit-identical to an uninterrupted run when the run
  itself is deterministic);
* checkpoints are written to a temporary file in the same folder and renamed;
* ``resume=True`` without a path (``tools/train.py --resume``) takes the
  newest checkpoint of the work dir that reads back whole: a truncated or
  unreadable one is skipped with a warning naming it;
* ``auto_scale_lr`` counts the accumulated batch (``optim_wrapper.accumulative_counts``,
  see :mod:`polaformerpp.engine.accumulation`): the lr is scaled by
  ``world size x batch x accumulative_counts / base_batch_size``;
* whether training resumes, and from which checkpoint, is decided once by rank 0
  and shared by every rank, which then check that they loaded the same file at
  the same iteration (:mod:`polaformerpp.engine.job_resume`): an elastic
  torchrun job (``--max-restarts`` > 0) resumes from the work dir's latest
  checkpoint whenever there is one, so a restarted or replacement node joins
  the resumed run;
* a checkpoint that cannot be written stops the run with a message naming the
  file and the free space of its folder (:class:`CheckpointSaveError`);
* distributed runs keep a heartbeat per rank (:mod:`polaformerpp.utils.peers`),
  so a failed collective is explained by the rank that stopped answering;
* evaluators that gather results through the file system (``collect_device='cpu'``)
  do so under the run's log dir in the work dir (``WORK_DIR/<timestamp>/.collect-*``,
  removed after each gathering), not in ``.dist_test`` of the current folder;
* the config's formatted text is computed once, not for every log, dump and
  checkpoint (:mod:`polaformerpp.engine.config_text`).
"""
import copy
import logging
import os.path as osp
from typing import Optional

from mmengine.dist import get_world_size, master_only
from mmengine.fileio import LocalBackend, get_file_backend
from mmengine.hooks import CheckpointHook
from mmengine.registry import RUNNERS
from mmengine.runner import BaseLoop, EpochBasedTrainLoop, IterBasedTrainLoop, Runner

from polaformerpp.utils.peers import set_stage, start_peer_watch
from polaformerpp.utils.runtime import DEFAULT_DIST_TIMEOUT

from .checkpoint_files import commit_temporary, discard, save_failure, temporary_path
from .config_text import memoize_config_formatting
from .hooks import AtomicCheckpointHook
from .job_resume import check_same_checkpoint, check_same_position, decide_for_job, decide_resume
from .loops import ResumableEpochBasedTrainLoop, ResumableIterBasedTrainLoop

_LOOP_SWAPS = (
    (('EpochBasedTrainLoop', 'mmengine.EpochBasedTrainLoop', EpochBasedTrainLoop),
     ResumableEpochBasedTrainLoop),
    (('IterBasedTrainLoop', 'mmengine.IterBasedTrainLoop', IterBasedTrainLoop),
     ResumableIterBasedTrainLoop),
)
_CHECKPOINT_HOOK_TYPES = ('CheckpointHook', 'mmengine.CheckpointHook', CheckpointHook)


def _wrappers(optim_wrapper):
    """The OptimWrappers inside ``optim_wrapper`` (itself, or the values of an OptimWrapperDict)."""
    return list(optim_wrapper.values()) if hasattr(optim_wrapper, 'values') else [optim_wrapper]


@RUNNERS.register_module()
class PolaRunner(Runner):
    """mmengine Runner with exact resumption, atomic checkpoints and elastic restarts (see module)."""

    _last_loaded_meta: Optional[dict] = None

    def __init__(self, *args, **kwargs):
        memoize_config_formatting()  # the config's text is formatted for the log, the dump and every checkpoint
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------ building
    def setup_env(self, env_cfg) -> None:
        """mmengine's environment set-up, then this rank's heartbeat in a distributed run."""
        super().setup_env(env_cfg)
        timeout = ((env_cfg or {}).get('dist_cfg') or {}).get('timeout') or DEFAULT_DIST_TIMEOUT
        start_peer_watch(timeout)

    def call_hook(self, fn_name: str, **kwargs) -> None:
        """mmengine's ``call_hook``; the hook point is what this rank's heartbeat reports."""
        loop = self._train_loop
        if isinstance(loop, BaseLoop):
            set_stage(f'{fn_name} (iteration {loop.iter})')
        else:
            set_stage(fn_name)
        super().call_hook(fn_name, **kwargs)

    def build_evaluator(self, evaluator):
        """mmengine's ``build_evaluator``; metrics gathering through files do so in the log dir.

        A metric with ``collect_device='cpu'`` and no ``collect_dir`` of its own
        gathers in ``<log_dir>/.collect-<i>-<name>`` (mmengine removes it after
        each gathering): the work dir is shared by every node of a multi-node
        job, the current folder (mmengine's ``.dist_test``) often is not.
        """
        evaluator = super().build_evaluator(evaluator)
        for index, metric in enumerate(getattr(evaluator, 'metrics', [])):
            if getattr(metric, 'collect_device', None) == 'cpu' and getattr(metric, 'collect_dir', '') is None:
                metric.collect_dir = osp.join(self.log_dir, f'.collect-{index}-{type(metric).__name__}')
        return evaluator

    def register_hooks(self, default_hooks=None, custom_hooks=None) -> None:
        """Register the hooks with ``checkpoint`` turned into an :class:`AtomicCheckpointHook`."""
        hooks = dict(default_hooks or {})
        checkpoint = hooks.get('checkpoint', dict(type='CheckpointHook', interval=1))
        if isinstance(checkpoint, dict) and checkpoint.get('type', 'CheckpointHook') in _CHECKPOINT_HOOK_TYPES:
            checkpoint = dict(checkpoint, type=AtomicCheckpointHook)
        hooks['checkpoint'] = checkpoint
        super().register_hooks(hooks, custom_hooks)

    def build_train_loop(self, loop):
        """Build the train loop, with mmengine's two loops replaced by the resumable ones."""
        if isinstance(loop, dict):
            loop = copy.deepcopy(loop)
            if 'type' not in loop and 'by_epoch' in loop:
                loop['type'] = 'EpochBasedTrainLoop' if loop.pop('by_epoch') else 'IterBasedTrainLoop'
            for names, resumable in _LOOP_SWAPS:
                if loop.get('type') in names:
                    loop['type'] = resumable
        return super().build_train_loop(loop)

    def scale_lr(self, optim_wrapper, auto_scale_lr=None) -> None:
        """mmengine's linear lr scaling with the images of all accumulated iterations in the batch."""
        counts = max((getattr(w, '_accumulative_counts', 1) for w in _wrappers(optim_wrapper)), default=1)
        if auto_scale_lr and auto_scale_lr.get('enable', False) and counts > 1:
            self.logger.info(f'auto_scale_lr: each optimizer step accumulates {counts} iterations, '
                             f'so the batch counted below is {counts} times smaller than the real one')
            auto_scale_lr = dict(auto_scale_lr, base_batch_size=auto_scale_lr['base_batch_size'] / counts)
        return super().scale_lr(optim_wrapper, auto_scale_lr)

    # ------------------------------------------------------------ saving
    @master_only
    def save_checkpoint(self, out_dir, filename, file_client_args=None, save_optimizer=True,
                        save_param_scheduler=True, meta=None, by_epoch=True, backend_args=None):
        """mmengine's ``save_checkpoint``, written atomically on a local disk.

        The file is written as ``.<filename>.tmp-<pid>`` next to its final name
        and renamed over it once complete; on an error the temporary file is
        removed and any previous file of that name is left as it was.
        """
        local = file_client_args is None and isinstance(
            get_file_backend(out_dir, backend_args=backend_args), LocalBackend)
        if not local:
            return super().save_checkpoint(out_dir, filename, file_client_args, save_optimizer,
                                           save_param_scheduler, meta, by_epoch, backend_args)
        final = osp.join(out_dir, filename)
        tmp = temporary_path(final)
        try:
            super().save_checkpoint(out_dir, osp.relpath(tmp, out_dir), None, save_optimizer,
                                    save_param_scheduler, meta, by_epoch, backend_args)
            commit_temporary(tmp, final)
        except OSError as error:
            discard(tmp)
            raise save_failure(final, error) from error
        except BaseException:
            discard(tmp)
            raise

    # ------------------------------------------------------------ loading
    def load_checkpoint(self, filename, map_location='cpu', strict=False,
                        revise_keys=[(r'^module.', '')]):  # noqa: B006 (mmengine's signature)
        """mmengine's ``load_checkpoint``; remembers the checkpoint's meta for :meth:`resume`."""
        checkpoint = super().load_checkpoint(filename, map_location=map_location, strict=strict,
                                             revise_keys=revise_keys)
        self._last_loaded_meta = checkpoint.get('meta', {}) if isinstance(checkpoint, dict) else {}
        return checkpoint

    def resume(self, filename, resume_optimizer=True, resume_param_scheduler=True,
               map_location='default') -> None:
        """mmengine's ``resume`` plus the loop position and random states of the checkpoint."""
        self._last_loaded_meta = None
        super().resume(filename, resume_optimizer, resume_param_scheduler, map_location)
        state = (self._last_loaded_meta or {}).get('resume_state')
        loop = self.train_loop
        if hasattr(loop, 'load_resume_state'):
            loop.load_resume_state(state, filename)
            self.logger.info(f'exact resume from {filename}: position '
                             f'{None if state is None else state["position"]}')

    def load_or_resume(self) -> None:
        """Resume as the whole job decided (see :mod:`~polaformerpp.engine.job_resume`) or load weights.

        The decision and the checks apply to training; ``val()`` / ``test()``
        load as mmengine does.
        """
        if self._has_loaded:
            return None
        if not isinstance(self._train_loop, BaseLoop):  # val() / test(): load_from only
            return super().load_or_resume()
        decision = decide_for_job(lambda: decide_resume(self._resume, self._load_from, self.work_dir),
                                  self.work_dir)
        for line in decision.reason.splitlines():
            self.logger.info(line)
        if decision.mode != 'resume':
            if self._resume and self._load_from is None:
                self.logger.log(logging.WARNING, f'resume: no checkpoint in {self.work_dir} yet; '
                                'training from the start')
                return None
            self._resume = False
            return super().load_or_resume()
        path = decision.path
        fingerprint = check_same_checkpoint(path)
        self.logger.info(f'Auto resumed from the latest checkpoint {path}.' if path != self._load_from
                         else f'resuming from {path}')
        self.resume(path)
        self._has_loaded = True
        check_same_position(path, fingerprint, self.iter, self.epoch)
        if get_world_size() > 1:
            self.logger.info(f'all {get_world_size()} ranks resumed from {path} ({fingerprint["digest"]}, '
                             f'{fingerprint["size"]} bytes) at iteration {self.iter}')
