"""``WarmupCosineLR``: a linear warm-up that replaces the start of one cosine, in closed form.

This is the schedule of timm's ``CosineLRScheduler`` without ``warmup_prefix``
(the Swin-style ImageNet recipes step it every iteration): the cosine spans the
whole run, ``end - begin`` steps, and during the first ``warmup`` steps the
warm-up line is used in its place. At step ``t`` (counted from ``begin``) and
for a base value ``b``::

    t <  warmup:  b * (warmup_start_factor + (1 - warmup_start_factor) * t / warmup)
    t >= warmup:  eta_min + (b - eta_min) * (1 + cos(pi * t / (end - begin))) / 2

with ``eta_min = b * eta_min_ratio``. mmengine's ``LinearLR`` followed by
``CosineAnnealingLR`` is a different curve: its cosine starts again from ``b``
after the warm-up (and its warm-up reaches ``b`` one step early). Values are
computed from the step count alone, so resuming and ``convert_to_iter_based``
(epochs given, iterations stepped) are exact.
"""
import math
from typing import Union

from mmengine.optim import BaseOptimWrapper
from mmengine.optim.scheduler.lr_scheduler import LRSchedulerMixin
from mmengine.optim.scheduler.param_scheduler import INF, _ParamScheduler
from mmengine.registry import PARAM_SCHEDULERS
from torch.optim import Optimizer


@PARAM_SCHEDULERS.register_module()
class WarmupCosineParamScheduler(_ParamScheduler):
    """Cosine over ``[begin, end)`` whose first ``warmup`` steps are a linear warm-up (module docstring).

    Args:
        optimizer: the (wrapped) optimizer.
        param_name: the param-group key scheduled (``'lr'`` for :class:`WarmupCosineLR`).
        warmup: warm-up length, in the scheduler's unit (epochs when ``by_epoch``).
        warmup_start_factor: value at step 0, as a fraction of the base value.
        eta_min_ratio: final value of the cosine, as a fraction of the base value.
        begin, end: the span of the cosine; ``end`` must be finite.
        last_step, by_epoch, verbose: as mmengine's schedulers.
    """

    def __init__(self, optimizer: Union[Optimizer, BaseOptimWrapper], param_name: str, warmup: int = 0,
                 warmup_start_factor: float = 0.0, eta_min_ratio: float = 0.0, begin: int = 0, end: int = INF,
                 last_step: int = -1, by_epoch: bool = True, verbose: bool = False):
        if end == INF:
            raise ValueError('WarmupCosine: `end` must be given (the cosine spans begin..end), got INF')
        if not 0 <= warmup < end - begin:
            raise ValueError(f'WarmupCosine: expected 0 <= warmup < end - begin = {end - begin}, got {warmup}')
        if not 0.0 <= warmup_start_factor <= 1.0:
            raise ValueError(f'WarmupCosine: expected warmup_start_factor in [0, 1], got {warmup_start_factor}')
        if not 0.0 <= eta_min_ratio <= 1.0:
            raise ValueError(f'WarmupCosine: expected eta_min_ratio in [0, 1], got {eta_min_ratio}')
        self.warmup = warmup
        self.warmup_start_factor = warmup_start_factor
        self.eta_min_ratio = eta_min_ratio
        super().__init__(optimizer, param_name=param_name, begin=begin, end=end, last_step=last_step,
                         by_epoch=by_epoch, verbose=verbose)

    @classmethod
    def build_iter_from_epoch(cls, *args, warmup=0, begin=0, end=INF, by_epoch=True, epoch_length=None, **kwargs):
        """The iteration-based scheduler of an epoch-based config (``convert_to_iter_based=True``)."""
        if not by_epoch:
            raise ValueError('WarmupCosine: only by_epoch=True configs convert to iterations')
        if not epoch_length or epoch_length <= 0:
            raise ValueError(f'WarmupCosine: expected a positive epoch_length, got {epoch_length}')
        end = end if end == INF else int(end * epoch_length)
        return cls(*args, warmup=int(warmup * epoch_length), begin=int(begin * epoch_length), end=end,
                   by_epoch=False, **kwargs)

    def factor(self, step: int) -> float:
        """The scheduled value at ``step`` (counted from ``begin``) as a fraction of the base value."""
        if step < self.warmup:
            return self.warmup_start_factor + (1.0 - self.warmup_start_factor) * step / self.warmup
        cosine = (1.0 + math.cos(math.pi * step / (self.end - self.begin))) / 2.0
        return self.eta_min_ratio + (1.0 - self.eta_min_ratio) * cosine

    def _get_value(self) -> list:
        return [base * self.factor(self.last_step) for base in self.base_values]


@PARAM_SCHEDULERS.register_module()
class WarmupCosineLR(LRSchedulerMixin, WarmupCosineParamScheduler):
    """:class:`WarmupCosineParamScheduler` of the learning rate."""
