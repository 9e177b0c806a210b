"""Training loops that resume exactly where a checkpoint was taken.

mmengine 0.10.7's loops restart an interrupted epoch from its first batch and
re-seed the random generators instead of restoring them, so a resumed run
drifts from an uninterrupted one. These loops, subclasses of mmengine's, keep
the run's behaviour and add:

* a *resume position*: for the epoch loop the epoch and the number of its
  batches already trained (iteration checkpoints inside an epoch resume
  mid-epoch); for the iteration loop the iteration;
* the random states to save with a checkpoint (:meth:`rng_snapshot`) and to
  restore on resume at the point where they were taken, after the data loader
  has been advanced past the trained batches (the skipped batches are loaded,
  not trained, so that data-loading workers replay their random streams);
* validation that leaves the training random streams untouched, so a run
  resumed after a validation step sees the same numbers as one that ran it.

A resume state (``checkpoint['meta']['resume_state']``)::

    dict(version=1, world_size=W, rng=[state of rank 0, ..., rank W-1],
         position=dict(kind='epoch', epoch=E, batches_done=B) | dict(kind='iter', iter=I))

Exactness needs the random streams of workers to restart with each data-loader
iterator (``persistent_workers=False`` in epoch loops; the iteration loop's
single iterator is replayed from its start) and ``randomness.seed`` set.
"""
import logging
from typing import Dict, Optional

from mmengine.logging import print_log
from mmengine.registry import LOOPS
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop

from .rng import capture_rng_state, preserved_rng_state, restore_rng_state

RESUME_STATE_VERSION = 1


class ResumableLoopMixin:
    """What the two resumable loops share: RNG snapshots, neutral validation, pending state."""

    def _init_resume(self) -> None:
        self._rng_before_val: Optional[Dict] = None
        self._pending_rng: Optional[Dict] = None

    def rng_snapshot(self) -> Dict:
        """The random state a checkpoint taken now must carry.

        During validation (where the best checkpoint is saved) it is the state
        from before validation, which is what training continues with.
        """
        if self._rng_before_val is not None:
            return self._rng_before_val
        return capture_rng_state()

    def run_validation(self) -> None:
        """``val_loop.run()`` with the training random streams restored afterwards."""
        with preserved_rng_state() as state:
            self._rng_before_val = state
            try:
                self.runner.val_loop.run()
            finally:
                self._rng_before_val = None

    def _take_rng(self, state: Optional[Dict], checkpoint: str) -> None:
        if state is None:
            return
        rank, world_size = self.runner.rank, self.runner.world_size
        states = state.get('rng') or []
        if len(states) != world_size:
            print_log(f'{checkpoint} was saved by {len(states)} processes, this run has {world_size}: '
                      'the random generators are not restored (the resumed run will not repeat the '
                      'interrupted one exactly)', logger='current', level=logging.WARNING)
            return
        self._pending_rng = states[rank]

    def _apply_pending_rng(self) -> None:
        if self._pending_rng is not None:
            restore_rng_state(self._pending_rng)
            self._pending_rng = None

    def _warn_if_persistent_workers(self) -> None:
        if self.dataloader.num_workers > 0 and getattr(self.dataloader, 'persistent_workers', False):
            print_log('train_dataloader uses persistent_workers=True: the workers\' random streams '
                      '(data augmentation) carry over epochs and are not restored on resume; set '
                      'persistent_workers=False for an exact resume', logger='current',
                      level=logging.WARNING)


@LOOPS.register_module()
class ResumableEpochBasedTrainLoop(ResumableLoopMixin, EpochBasedTrainLoop):
    """mmengine's ``EpochBasedTrainLoop`` that resumes mid-epoch and restores the RNG states.

    Same arguments as ``EpochBasedTrainLoop``; :class:`polaformerpp.engine.PolaRunner`
    uses it in place of that loop.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._init_resume()
        self._batches_done = 0  # batches of the current epoch trained so far
        self._epoch_finished = False  # inside after_train_epoch
        self._skip = 0

    def resume_position(self) -> Dict:
        """Where a checkpoint taken now resumes: epoch and batches of it already trained."""
        if self._epoch_finished:
            return dict(kind='epoch', epoch=self._epoch + 1, batches_done=0)
        return dict(kind='epoch', epoch=self._epoch, batches_done=self._batches_done)

    def load_resume_state(self, state: Optional[Dict], checkpoint: str) -> None:
        """Take the resume state of ``checkpoint`` (None for a checkpoint without one)."""
        if state is None:
            print_log(f'{checkpoint} has no resume state (saved without PolaRunner): the epoch '
                      f'{self._epoch} restarts from its first batch and the random generators are '
                      'not restored', logger='current', level=logging.WARNING)
            return
        position = state['position']
        if position.get('kind') != 'epoch':
            raise ValueError(f'{checkpoint}: its resume position {position} is not an epoch-based '
                             'one; resume it with the loop type it was trained with')
        self._epoch = int(position['epoch'])
        self._skip = int(position['batches_done'])
        if self._skip > len(self.dataloader):
            raise ValueError(f'{checkpoint}: {self._skip} batches of epoch {self._epoch} were '
                             f'trained, but the train dataloader has {len(self.dataloader)}')
        self._take_rng(state, checkpoint)
        self._warn_if_persistent_workers()

    def run(self):
        """Launch training (as mmengine's loop, with RNG-neutral validation)."""
        self.runner.call_hook('before_train')
        while self._epoch < self._max_epochs and not self.stop_training:
            self.run_epoch()
            self._decide_current_val_interval()
            if (self.runner.val_loop is not None and self._epoch >= self.val_begin
                    and (self._epoch % self.val_interval == 0 or self._epoch == self._max_epochs)):
                self.run_validation()
        self.runner.call_hook('after_train')
        return self.runner.model

    def run_epoch(self) -> None:
        """Iterate one epoch, starting after the batches a resumed checkpoint already trained."""
        skip, self._skip = self._skip, 0
        if skip == 0:  # the checkpoint was taken at an epoch boundary
            self._apply_pending_rng()
        self.runner.call_hook('before_train_epoch')
        self.runner.model.train()
        batches = iter(self.dataloader)
        if skip:
            print_log(f'Resuming epoch {self._epoch + 1} after its first {skip} batches '
                      '(loading them to advance the data loader)', logger='current')
            for _ in range(skip):
                next(batches)
            self._apply_pending_rng()
        self._batches_done = skip
        for idx, data_batch in enumerate(batches, start=skip):
            self._batches_done = idx + 1
            self.run_iter(idx, data_batch)
        self._epoch_finished = True
        try:
            self.runner.call_hook('after_train_epoch')
        finally:
            self._epoch_finished = False
        self._epoch += 1
        self._batches_done = 0


@LOOPS.register_module()
class ResumableIterBasedTrainLoop(ResumableLoopMixin, IterBasedTrainLoop):
    """mmengine's ``IterBasedTrainLoop`` that restores the RNG states on resume.

    The data iterator is advanced past the trained iterations (as mmengine does)
    and then the random generators are put back as the checkpoint recorded them.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._init_resume()
        self._in_iter = False  # inside run_iter (its hooks run before the count moves on)

    def resume_position(self) -> Dict:
        """Where a checkpoint taken now resumes: the iteration."""
        # inside after_train_iter the loop has not counted the finished iteration yet
        return dict(kind='iter', iter=self._iter + 1 if self._in_iter else self._iter)

    def load_resume_state(self, state: Optional[Dict], checkpoint: str) -> None:
        """Take the resume state of ``checkpoint`` (None for a checkpoint without one)."""
        if state is None:
            print_log(f'{checkpoint} has no resume state (saved without PolaRunner): the random '
                      'generators are not restored', logger='current', level=logging.WARNING)
            return
        position = state['position']
        if position.get('kind') != 'iter' or int(position['iter']) != self._iter:
            raise ValueError(f'{checkpoint}: resume position {position} does not match its '
                             f'meta iteration {self._iter}')
        self._take_rng(state, checkpoint)

    def run_iter(self, data_batch) -> None:
        """One iteration (mmengine's), marking that its hooks are running."""
        self._in_iter = True
        try:
            super().run_iter(data_batch)
        finally:
            self._in_iter = False

    def run(self):
        """Launch training: skip the trained iterations, restore the RNG, train, validate."""
        self.runner.call_hook('before_train')
        self.runner.call_hook('before_train_epoch')
        if self._iter > 0:
            print_log(f'Resuming at iteration {self._iter} (loading the trained batches to advance '
                      'the data loader)', logger='current')
            for _ in range(self._iter):
                next(self.dataloader_iterator)
        self._apply_pending_rng()
        while self._iter < self._max_iters and not self.stop_training:
            self.runner.model.train()
            data_batch = next(self.dataloader_iterator)
            self.run_iter(data_batch)
            self._decide_current_val_interval()
            if (self.runner.val_loop is not None and self._iter >= self.val_begin
                    and (self._iter % self.val_interval == 0 or self._iter == self._max_iters)):
                self.run_validation()
        self.runner.call_hook('after_train_epoch')
        self.runner.call_hook('after_train')
        return self.runner.model
