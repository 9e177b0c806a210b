"""``WarmupCosineLR``: timm's ``CosineLRScheduler`` as the Swin-style ImageNet scripts run it, in closed form.

Those scripts build ``CosineLRScheduler(t_initial=T, lr_min, warmup_lr_init,
warmup_t=W, cycle_limit=1, t_in_epochs=False)`` (no ``warmup_prefix``), with
``T`` and ``W`` the cosine and warm-up epochs times the iterations per epoch,
train ``C`` cool-down epochs after the ``T`` steps, and call
``step_update(t)`` after the optimizer step ``t``. At update ``t`` (counted from
``begin``) and for a base value ``b`` the schedule is::

    t <  W:       b * (warmup_start_factor + (1 - warmup_start_factor) * t / W)
    W <= t < T:   eta_min + (b - eta_min) * (1 + cos(pi * t / T)) / 2
    t >= T:       eta_min                     (the cool-down: timm's cycle_limit=1)

with ``eta_min = b * eta_min_ratio`` and ``T = end - begin - cooldown``: the
cosine spans the whole run but its first ``W`` steps are replaced by the
warm-up line (so the lr drops a little when the warm-up ends), and the
scheduler's span ``[begin, end)`` includes the cool-down. mmengine's ``LinearLR``
followed by ``CosineAnnealingLR`` is a different curve (its cosine starts again
from ``b`` after the warm-up, and nothing holds the minimum afterwards).

Two options reproduce the order of such a training loop exactly:

* ``lagged=True``: the value set after update ``t`` is the schedule at ``t``,
  so update ``t`` trains with the schedule at ``t - 1`` (update 0 with the
  schedule at 0, which the scheduler sets when it is built).
* ``accumulative_counts=N`` (set by ``tools/train.py --accumulate N``, which
  also sets ``optim_wrapper.accumulative_counts``): the scheduler is stepped
  every iteration but an optimizer update spans ``N`` of them, so the value
  changes only where an update begins, and ``t`` counts updates. Lengths
  (``warmup``, ``cooldown``, ``begin``, ``end``) stay in iterations.

Values are computed from the step count alone, so resuming and
``convert_to_iter_based`` (epochs given, iterations stepped) are exact.
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
    """Linear warm-up replacing the start of a cosine, then a constant cool-down (module docstring).

    Args:
        optimizer: the (wrapped) optimizer.
        param_name: the param-group key scheduled (``'lr'`` for :class:`WarmupCosineLR`).
        warmup: warm-up length, in the scheduler's unit (epochs when ``by_epoch``).
        warmup_start_factor: value at step 0, as a fraction of the base value.
        eta_min_ratio: final value of the cosine, as a fraction of the base value.
        cooldown: steps at the end of ``[begin, end)`` held at the final value (the
            cosine spans the ``end - begin - cooldown`` steps before them).
        lagged: each optimizer update uses the value of the update before it (see the
            module docstring).
        accumulative_counts: iterations per optimizer update (gradient accumulation).
        begin, end: the span of the schedule; ``end`` must be finite.
        last_step, by_epoch, verbose: as mmengine's schedulers.
    """

    def __init__(self, optimizer: Union[Optimizer, BaseOptimWrapper], param_name: str, warmup: int = 0,
                 warmup_start_factor: float = 0.0, eta_min_ratio: float = 0.0, cooldown: int = 0,
                 lagged: bool = False, accumulative_counts: int = 1, begin: int = 0, end: int = INF,
                 last_step: int = -1, by_epoch: bool = True, verbose: bool = False):
        if end == INF:
            raise ValueError('WarmupCosine: `end` must be given (the schedule spans begin..end), got INF')
        if not 0 <= cooldown < end - begin:
            raise ValueError(f'WarmupCosine: expected 0 <= cooldown < end - begin = {end - begin}, got {cooldown}')
        if not 0 <= warmup < end - begin - cooldown:
            raise ValueError(f'WarmupCosine: expected 0 <= warmup < end - begin - cooldown = '
                             f'{end - begin - cooldown} (the cosine\'s length), got {warmup}')
        if not 0.0 <= warmup_start_factor <= 1.0:
            raise ValueError(f'WarmupCosine: expected warmup_start_factor in [0, 1], got {warmup_start_factor}')
        if not 0.0 <= eta_min_ratio <= 1.0:
            raise ValueError(f'WarmupCosine: expected eta_min_ratio in [0, 1], got {eta_min_ratio}')
        if isinstance(accumulative_counts, bool) or not isinstance(accumulative_counts, int) \
                or accumulative_counts < 1:
            raise ValueError(f'WarmupCosine: expected a positive integer accumulative_counts, '
                             f'got {accumulative_counts!r}')
        if by_epoch and accumulative_counts != 1:
            raise ValueError('WarmupCosine: accumulative_counts applies to iteration-based schedules '
                             '(by_epoch=False or convert_to_iter_based=True), got by_epoch=True')
        self.warmup = warmup
        self.warmup_start_factor = warmup_start_factor
        self.eta_min_ratio = eta_min_ratio
        self.cooldown = cooldown
        self.lagged = bool(lagged)
        self.accumulative_counts = accumulative_counts
        super().__init__(optimizer, param_name=param_name, begin=begin, end=end, last_step=last_step,
                         by_epoch=by_epoch, verbose=verbose)

    @classmethod
    def build_iter_from_epoch(cls, *args, warmup=0, cooldown=0, begin=0, end=INF, by_epoch=True,
                              epoch_length=None, **kwargs):
        """The iteration-based scheduler of an epoch-based config (``convert_to_iter_based=True``)."""
        if not by_epoch:
            raise ValueError('WarmupCosine: only by_epoch=True configs convert to iterations')
        if not epoch_length or epoch_length <= 0:
            raise ValueError(f'WarmupCosine: expected a positive epoch_length, got {epoch_length}')
        end = end if end == INF else int(end * epoch_length)
        return cls(*args, warmup=int(warmup * epoch_length), cooldown=int(cooldown * epoch_length),
                   begin=int(begin * epoch_length), end=end, by_epoch=False, **kwargs)

    @property
    def cosine_length(self) -> int:
        """``T``: the steps of the cosine (timm's ``t_initial``), cool-down excluded."""
        return self.end - self.begin - self.cooldown

    def update_index(self, step: int) -> int:
        """The update whose schedule value step ``step`` (from ``begin``) trains with, in steps.

        The first step of that update's accumulation window, one update earlier when ``lagged``.
        """
        update = step // self.accumulative_counts - (1 if self.lagged else 0)
        return max(update, 0) * self.accumulative_counts

    def factor(self, step: int) -> float:
        """The value used at ``step`` (counted from ``begin``) as a fraction of the base value."""
        t = self.update_index(step)
        if t < self.warmup:
            return self.warmup_start_factor + (1.0 - self.warmup_start_factor) * t / self.warmup
        if t >= self.cosine_length:
            return self.eta_min_ratio
        cosine = (1.0 + math.cos(math.pi * t / self.cosine_length)) / 2.0
        return self.eta_min_ratio + (1.0 - self.eta_min_ratio) * cosine

    def _get_value(self) -> list:
        return [base * self.factor(self.last_step) for base in self.base_values]


@PARAM_SCHEDULERS.register_module()
class WarmupCosineLR(LRSchedulerMixin, WarmupCosineParamScheduler):
    """:class:`WarmupCosineParamScheduler` of the learning rate."""
