"""Training engine: exact resumption, atomic checkpoints, one resumption decision per job.

Importing this package (``custom_imports=dict(imports=['polaformerpp.engine'])``)
registers in mmengine's root registries, visible from every library scope:

* ``RUNNERS``: :class:`PolaRunner` (``runner_type = 'PolaRunner'`` in a config),
* ``LOOPS``: :class:`ResumableEpochBasedTrainLoop`, :class:`ResumableIterBasedTrainLoop`,
* ``HOOKS``: :class:`AtomicCheckpointHook`,
* ``PARAM_SCHEDULERS``: :class:`WarmupCosineLR` (timm's warm-up + cosine, in closed form).

:func:`apply_accumulation` turns a config into its gradient-accumulating form
(``tools/train.py --accumulate N``).
"""
from .accumulation import accumulated, apply_accumulation
from .checkpoint_files import CheckpointSaveError, atomic_write_text, checkpoint_problem, find_resumable_checkpoint
from .hooks import AtomicCheckpointHook, collect_resume_state
from .job_resume import (
    ResumeMismatchError,
    checkpoint_fingerprint,
    decide_resume,
    elastic_max_restarts,
    elastic_restart_count,
)
from .loops import ResumableEpochBasedTrainLoop, ResumableIterBasedTrainLoop
from .rng import capture_rng_state, preserved_rng_state, restore_rng_state
from .runner import PolaRunner
from .schedulers import WarmupCosineLR, WarmupCosineParamScheduler

__all__ = [
    'AtomicCheckpointHook', 'CheckpointSaveError', 'PolaRunner', 'ResumeMismatchError', 'checkpoint_fingerprint',
    'decide_resume', 'elastic_max_restarts', 'ResumableEpochBasedTrainLoop', 'ResumableIterBasedTrainLoop',
    'WarmupCosineLR', 'WarmupCosineParamScheduler', 'accumulated', 'apply_accumulation', 'atomic_write_text',
    'capture_rng_state', 'checkpoint_problem', 'collect_resume_state', 'elastic_restart_count',
    'find_resumable_checkpoint', 'preserved_rng_state', 'restore_rng_state',
]
