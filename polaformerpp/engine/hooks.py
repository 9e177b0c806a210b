"""``AtomicCheckpointHook``: mmengine's CheckpointHook with exact-resume state and safe file updates.

Differences from ``mmengine.hooks.CheckpointHook`` (same arguments):

* every checkpoint carries ``meta['resume_state']`` (the random states of all
  ranks and the loop position; see :mod:`polaformerpp.engine.loops`), gathered
  on every rank before rank 0 writes;
* the ``last_checkpoint`` pointer is replaced atomically (temporary file + rename);
* an old checkpoint beyond ``max_keep_ckpts`` is deleted only after the new
  one and the pointer are in place, so a kill in between never leaves the work
  dir without a complete checkpoint (mmengine deletes first).

The checkpoint file itself is written atomically by
:meth:`polaformerpp.engine.PolaRunner.save_checkpoint`.
"""
import os.path as osp
from typing import Dict, Optional

from mmengine.dist import all_gather_object, get_world_size, is_main_process
from mmengine.hooks import CheckpointHook
from mmengine.registry import HOOKS

from .checkpoint_files import POINTER_NAME, atomic_write_text, save_failure
from .loops import RESUME_STATE_VERSION


def collect_resume_state(runner) -> Optional[Dict]:
    """The resume state of ``runner``'s train loop, gathered from all ranks (collective).

    Returns None when the loop is not one of the resumable loops.
    """
    loop = runner.train_loop
    if not hasattr(loop, 'resume_position'):
        return None
    rng = loop.rng_snapshot()
    world_size = get_world_size()
    states = all_gather_object(rng) if world_size > 1 else [rng]
    return dict(version=RESUME_STATE_VERSION, world_size=world_size, rng=states,
                position=loop.resume_position())


@HOOKS.register_module()
class AtomicCheckpointHook(CheckpointHook):
    """CheckpointHook that records the resume state and updates its files atomically."""

    def _save_checkpoint_with_step(self, runner, step, meta):
        state = collect_resume_state(runner)
        meta = dict(meta)
        if state is not None:
            meta['resume_state'] = state

        outdated = None
        if self.max_keep_ckpts > 0 and not (self.keep_ckpt_ids and self.keep_ckpt_ids[-1] == step):
            if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                outdated = self.keep_ckpt_ids.popleft()
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info('keep_ckpt_ids', list(self.keep_ckpt_ids))

        filename = self.filename_tmpl.format(step)
        self.last_ckpt = self.file_backend.join_path(self.out_dir, filename)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        runner.save_checkpoint(
            self.out_dir, filename, self.file_client_args, save_optimizer=self.save_optimizer,
            save_param_scheduler=self.save_param_scheduler, meta=meta, by_epoch=self.by_epoch,
            backend_args=self.backend_args, **self.args)
        if not is_main_process():
            return
        pointer = osp.join(runner.work_dir, POINTER_NAME)
        try:
            atomic_write_text(pointer, self.last_ckpt)
        except OSError as error:
            raise save_failure(pointer, error, what='the checkpoint pointer') from error
        if outdated is not None and outdated != step:
            path = self.file_backend.join_path(self.out_dir, self.filename_tmpl.format(outdated))
            if self.file_backend.isfile(path):
                self.file_backend.remove(path)
            elif self.file_backend.isdir(path):  # checkpoints saved by deepspeed are folders
                self.file_backend.rmtree(path)
