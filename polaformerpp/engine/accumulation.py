"""Gradient accumulation that keeps a recipe's images per step, schedule and EMA.

``tools/train.py --accumulate N`` lets G GPUs train a recipe written for
``N x G`` GPUs: each optimizer step sums the gradients of N iterations
(mmengine's ``optim_wrapper.accumulative_counts``, which also scales the loss
by 1/N and skips DDP's all-reduce on the first N - 1 of them). mmengine counts
everything else in iterations, i.e. in forward passes, so a config needs more
than that one key to train the same recipe:

* every count of iterations is multiplied by N: ``train_cfg.max_iters``,
  ``val_interval`` and ``val_begin`` of an iteration-based loop, the ``begin`` /
  ``end`` and the lengths (``milestones``, ``T_max``, ``step_size``, ...) of the
  iteration-based parameter schedulers (also the warm-ups of epoch-based
  recipes), an iteration-based checkpoint interval and the logging interval.
  Epochs stay epochs (an epoch simply holds N times more iterations); schedulers
  converted from epochs (``convert_to_iter_based``) already measure epochs in
  the loader's iterations.
* ``EMAHook`` averages once per optimizer step, right after it: its
  ``interval`` is multiplied by N and ``begin_iter`` b becomes
  ``N*max(b - 1, 0) + N``. The hook copies the weights until it starts (on the
  first iteration i with ``i + 1 >= begin_iter``) and its averaged model then
  updates on every ``interval``-th call, so the updates fall on the iterations
  ``N*k + N - 1`` that end with an optimizer step: the same
  sequence of averaged weights as without accumulation. (A hook that starts at
  ``begin_epoch`` is started by epoch; its updates are one per step as well,
  but N - 1 iterations before the step.)
* ``--auto-scale-lr`` counts the accumulated batch: :class:`~polaformerpp.engine.PolaRunner`
  scales by ``world size x batch x accumulative_counts / base_batch_size``
  (mmengine's Runner leaves the accumulation out).

* ``WarmupCosineLR`` schedulers stepped by iteration (``by_epoch=False`` or
  ``convert_to_iter_based``) get ``accumulative_counts`` N as well: they change
  their value only where an update begins and count updates, so the update made
  on iteration ``N*s + N - 1`` uses exactly the published value of step ``s``.

mmengine's own schedulers are evaluated at iterations, so there the step made on
iteration ``N*s + N - 1`` uses the published schedule's value within one step of
``s`` (``s + (N - 1)/N`` steps for closed forms; mmengine's chained ``LinearLR``
counts ``end - begin - 1`` steps, a little less than one step apart): it only
shows in the first warm-up steps.
"""
import copy
import math
from typing import Iterable

#: scheduler arguments that are lengths or positions in iterations when ``by_epoch=False``
_SCHEDULER_ITERATION_KEYS = ('begin', 'end', 'T_max', 'step_size', 'total_steps', 'periods', 'milestones',
                             'warmup', 'cooldown')
#: schedulers that take the accumulation count themselves (polaformerpp.engine.schedulers)
_ACCUMULATING_SCHEDULERS = ('WarmupCosineLR', 'WarmupCosineParamScheduler')
#: scheduler types whose other arguments hold no iteration counts (mmengine's own; the exponential ones
#: decay per step and are refused)
_KNOWN_SCHEDULERS = ('WarmupCosineLR', 'WarmupCosineParamScheduler',
                     'LinearLR', 'ConstantLR', 'CosineAnnealingLR', 'MultiStepLR', 'StepLR', 'PolyLR',
                     'OneCycleLR', 'CosineRestartLR', 'LinearParamScheduler',
                     'ConstantParamScheduler', 'CosineAnnealingParamScheduler', 'MultiStepParamScheduler',
                     'StepParamScheduler', 'PolyParamScheduler',
                     'OneCycleParamScheduler', 'CosineRestartParamScheduler', 'LinearMomentum',
                     'ConstantMomentum', 'CosineAnnealingMomentum', 'MultiStepMomentum', 'StepMomentum',
                     'PolyMomentum', 'CosineRestartMomentum')
_EMA_HOOKS = ('EMAHook', 'mmengine.EMAHook', 'mmpretrain.EMAHook', 'mmdet.EMAHook')


def _scaled(value, n: int):
    if isinstance(value, (list, tuple)):
        return type(value)(_scaled(v, n) for v in value)
    if isinstance(value, float) and math.isinf(value):
        return value
    return value * n


def _is_iteration_loop(train_cfg) -> bool:
    loop_type = str(train_cfg.get('type', ''))
    return 'max_iters' in train_cfg or loop_type.endswith('IterBasedTrainLoop') or train_cfg.get('by_epoch') is False


def _stretch_schedulers(schedulers, n: int) -> None:
    for scheduler in ([schedulers] if isinstance(schedulers, dict) else schedulers):
        by_epoch = scheduler.get('by_epoch', True)
        kind = str(scheduler.get('type', '')).split('.')[-1]
        if kind in _ACCUMULATING_SCHEDULERS and (not by_epoch or scheduler.get('convert_to_iter_based')):
            scheduler['accumulative_counts'] = scheduler.get('accumulative_counts', 1) * n
        if by_epoch:
            continue  # counted in epochs (or converted from epochs by the Runner): unchanged
        if kind not in _KNOWN_SCHEDULERS:
            raise ValueError(f'--accumulate: param_scheduler type {scheduler.get("type")!r} is iteration-based and '
                             'not one whose iteration counts are known; expected one of mmengine\'s schedulers '
                             f'({", ".join(_KNOWN_SCHEDULERS[:9])}, ...)')
        for key in _SCHEDULER_ITERATION_KEYS:
            if key in scheduler and scheduler[key] is not None:
                scheduler[key] = _scaled(scheduler[key], n)


def _ema_hooks(custom_hooks: Iterable):
    return [hook for hook in custom_hooks or () if str(hook.get('type', '')) in _EMA_HOOKS]


def apply_accumulation(cfg, n: int):
    """Make ``cfg`` accumulate gradients over ``n`` iterations and keep its recipe per optimizer step.

    Modifies ``cfg`` in place and returns it. ``n = 1`` leaves it unchanged.

    Raises:
        ValueError: ``n`` is not a positive integer, the config has several
            optimizers (``optim_wrapper`` without ``optimizer``), or an
            iteration-based scheduler of an unknown type.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f'--accumulate: expected a positive integer number of iterations, got {n!r}')
    if n == 1:
        return cfg
    if 'optimizer' not in cfg.optim_wrapper:
        raise ValueError('--accumulate: expected one optimizer (optim_wrapper.optimizer); '
                         'configs with several optim wrappers are not supported')
    cfg.optim_wrapper.accumulative_counts = cfg.optim_wrapper.get('accumulative_counts', 1) * n

    train_cfg = cfg.train_cfg
    if _is_iteration_loop(train_cfg):
        for key in ('max_iters', 'val_interval', 'val_begin'):
            if key in train_cfg and train_cfg[key] is not None:
                train_cfg[key] = _scaled(train_cfg[key], n)
        if train_cfg.get('dynamic_intervals'):
            train_cfg.dynamic_intervals = [(_scaled(at, n), _scaled(every, n))
                                           for at, every in train_cfg.dynamic_intervals]
    if cfg.get('param_scheduler') is not None:
        _stretch_schedulers(cfg.param_scheduler, n)

    hooks = cfg.get('default_hooks') or {}
    checkpoint = hooks.get('checkpoint')
    if checkpoint and checkpoint.get('by_epoch', True) is False and 'interval' in checkpoint:
        checkpoint.interval = _scaled(checkpoint.interval, n)
    if hooks.get('logger') and 'interval' in hooks.logger:
        hooks.logger.interval = _scaled(hooks.logger.interval, n)

    for hook in _ema_hooks(cfg.get('custom_hooks')):
        hook['interval'] = hook.get('interval', 1) * n
        if not hook.get('begin_epoch'):
            # the hook starts on the iteration i with i + 1 >= begin_iter: max(b - 1, 0) unaccumulated
            hook['begin_iter'] = max(hook.get('begin_iter', 0) - 1, 0) * n + n
    return cfg


def accumulated(cfg, n: int):
    """A copy of ``cfg`` with :func:`apply_accumulation` applied."""
    return apply_accumulation(copy.deepcopy(cfg), n)
