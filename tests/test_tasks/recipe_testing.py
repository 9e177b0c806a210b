"""Helpers for the recipe tests: what a config trains with, read back from mmengine's own builders.

Imported by the ``test_*_configs.py`` files as ``from recipe_testing import ...``.
Every value comes from the objects mmengine builds from the config (model,
optim wrapper, parameter schedulers), never from re-reading config keys, so a
test that uses them holds what a run would actually do.
"""
import copy
import os.path as osp
import re
from typing import Dict, List, Optional, Sequence

import torch

_GPUS_X_BATCH = re.compile(r'_(\d+)xb(\d+)[-_]')


def published_gpus_and_batch(cfg):
    """``(G, B)`` from the ``_<G>xb<B>`` part of the config's file name."""
    name = osp.basename(cfg.filename)
    match = _GPUS_X_BATCH.search(name)
    assert match, f'{name}: no <GPUs>xb<batch> part in the name'
    return int(match.group(1)), int(match.group(2))


def images_per_iteration(cfg) -> int:
    """Images per optimizer step at the config's own GPU count: G x batch x accumulation.

    Also checks that the name's per-GPU batch is the dataloader's.
    """
    gpus, batch = published_gpus_and_batch(cfg)
    assert cfg.train_dataloader.batch_size == batch, (
        f'{osp.basename(cfg.filename)}: the name says {batch} per GPU, '
        f'train_dataloader.batch_size is {cfg.train_dataloader.batch_size}')
    return gpus * batch * cfg.optim_wrapper.get('accumulative_counts', 1)


def build_model(cfg):
    """``cfg.model`` built in the config's ``default_scope``, with its data preprocessor as the Runner adds it."""
    from mmengine.registry import MODELS, init_default_scope

    import polaformerpp  # noqa: F401  (registers the backbone and the task models)
    init_default_scope(cfg.get('default_scope') or 'mmengine')
    model_cfg = copy.deepcopy(cfg.model)
    if cfg.get('data_preprocessor') is not None:
        model_cfg.setdefault('data_preprocessor', copy.deepcopy(cfg.data_preprocessor))
    return MODELS.build(model_cfg)


def _wrapper_cfg(cfg):
    """``cfg.optim_wrapper`` as the tools build it on this machine (``adapt_cfg_to_device``:
    without CUDA an ``AmpOptimWrapper`` becomes an ``OptimWrapper`` with the same param groups)."""
    from mmengine.config import ConfigDict

    from polaformerpp.utils.runtime import adapt_cfg_to_device
    runnable = ConfigDict(optim_wrapper=copy.deepcopy(cfg.optim_wrapper))
    adapt_cfg_to_device(runnable)
    return runnable.optim_wrapper


def optim_wrapper(cfg, model):
    """The optim wrapper mmengine builds from ``cfg.optim_wrapper`` for ``model``."""
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import init_default_scope
    init_default_scope(cfg.get('default_scope') or 'mmengine')
    return build_optim_wrapper(model, _wrapper_cfg(cfg))


def optimizer_groups(cfg, model) -> List[Dict]:
    """The parameter groups of the optim wrapper mmengine builds from ``cfg.optim_wrapper``.

    Each is ``dict(names=[parameter names], lr=..., weight_decay=...)``.
    """
    names = {id(p): n for n, p in model.named_parameters()}
    groups = []
    for group in optim_wrapper(cfg, model).optimizer.param_groups:
        groups.append(dict(names=[names[id(p)] for p in group['params']], lr=group['lr'],
                           weight_decay=group.get('weight_decay', 0.0)))
    return groups


def decayed_names(cfg, model) -> set:
    """Names of the trainable parameters that the built optimizer decays (weight_decay > 0)."""
    return {n for g in optimizer_groups(cfg, model) if g['weight_decay'] > 0 for n in g['names']}


def lr_at(cfg, iterations: Sequence[int], epoch_length: Optional[int] = None) -> List[float]:
    """The learning rate (multiplier 1) used at each 0-based training iteration in ``iterations``.

    The config's ``param_scheduler`` is built by mmengine on a one-parameter
    optimizer from ``cfg.optim_wrapper`` and stepped as its ParamSchedulerHook
    steps it: iteration-based schedulers after every iteration, epoch-based ones
    after every ``epoch_length`` iterations (``convert_to_iter_based`` ones are
    turned into iteration-based ones with that length, as the Runner does).
    """
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import PARAM_SCHEDULERS, init_default_scope
    init_default_scope(cfg.get('default_scope') or 'mmengine')
    wrapper_cfg = _wrapper_cfg(cfg)
    wrapper_cfg.pop('paramwise_cfg', None)
    wrapper_cfg.pop('constructor', None)
    wrapper = build_optim_wrapper(torch.nn.Linear(1, 1, bias=False), wrapper_cfg)
    scheduler_cfgs = cfg.param_scheduler
    if isinstance(scheduler_cfgs, dict):
        scheduler_cfgs = [scheduler_cfgs]
    schedulers = []
    for scheduler_cfg in copy.deepcopy(scheduler_cfgs):
        scheduler_cfg.setdefault('by_epoch', True)
        if scheduler_cfg['by_epoch'] or scheduler_cfg.get('convert_to_iter_based', False):
            assert epoch_length, f'{scheduler_cfg["type"]} is epoch-based: lr_at needs epoch_length'
        scheduler_cfg['epoch_length'] = epoch_length
        schedulers.append(PARAM_SCHEDULERS.build(dict(scheduler_cfg, optimizer=wrapper)))
    wanted, last = set(iterations), max(iterations)
    values, group = {}, wrapper.optimizer.param_groups[0]
    for iteration in range(last + 1):
        if iteration in wanted:
            values[iteration] = group['lr']
        if iteration == last:
            break
        for scheduler in schedulers:  # ParamSchedulerHook.after_train_iter
            if not scheduler.by_epoch:
                scheduler.step()
        if epoch_length and (iteration + 1) % epoch_length == 0:  # after_train_epoch
            for scheduler in schedulers:
                if scheduler.by_epoch:
                    scheduler.step()
    return [values[i] for i in iterations]


def authors_name(name: str) -> str:
    """The name the authors' detector / segmentor gives a parameter ``name`` of ours.

    Backbone parameters map through the converter's :func:`official_key`, the
    dense outputs' ``norm<i>`` to their ``extra_norms.<i>.norm``; necks and heads
    are the libraries' modules, named alike in both.
    """
    from polaformerpp.models.backbones.polaformerpp_convert import official_key
    if not name.startswith('backbone.'):
        return name
    out_norm = re.fullmatch(r'backbone\.norm(\d)\.(weight|bias)', name)
    if out_norm:
        return f'backbone.extra_norms.{out_norm[1]}.norm.{out_norm[2]}'
    key = official_key(name)
    assert key, name
    return 'backbone.' + key


def norm_training_modes(model) -> Dict[str, bool]:
    """For every normalisation layer of ``model``: is it in training mode after ``model.train()``?"""
    norm_types = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.GroupNorm, torch.nn.LayerNorm,
                  torch.nn.modules.instancenorm._InstanceNorm)
    model.train()
    return {name: module.training for name, module in model.named_modules() if isinstance(module, norm_types)}
