"""Run-time adjustments the project's tools apply before building an mmengine Runner.

They keep mmengine 0.10.7 working on current torch and on machines without a
GPU, without touching installed packages:

* torch >= 2.6 loads checkpoints with ``weights_only=True`` by default, which
  rejects the Runner's own checkpoints (message hub, numpy state) on
  ``--resume`` and ``load_from``. The tools load only checkpoints the user
  names, so they opt back into full unpickling (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``).
* On a CPU-only machine, distributed runs use gloo, DDP gets ``device_ids=None``,
  mixed precision falls back to fp32 and SyncBN to BN (each logged).
"""
import copy
import os
import os.path as osp

import torch
import torch.distributed as dist
from mmengine.logging import print_log

__all__ = [
    'allow_trusted_checkpoint_loading', 'apply_common_args', 'adapt_cfg_to_device',
    'init_distributed_if_cpu', 'shutdown_distributed'
]


def allow_trusted_checkpoint_loading() -> None:
    """Let ``torch.load`` unpickle Runner checkpoints (trusted, user-named files)."""
    os.environ.setdefault('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', '1')


def apply_common_args(cfg, args) -> None:
    """What tools/train.py and tools/test.py share: launcher, ``--cfg-options``, work dir.

    The work dir is ``--work-dir``, else the config's, else ``./work_dirs/<config name>``.
    """
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(args.config))[0])


def _replace_sync_bn(node):
    """Recursively turn ``type='SyncBN'`` norm configs into ``'BN'``; returns how many."""
    count = 0
    if isinstance(node, dict):
        if node.get('type') == 'SyncBN':
            node['type'] = 'BN'
            count += 1
        for value in node.values():
            count += _replace_sync_bn(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            count += _replace_sync_bn(value)
    return count


def adapt_cfg_to_device(cfg, launcher: str = 'none') -> None:
    """Make ``cfg`` runnable on this machine (in place); a no-op when CUDA is available."""
    if torch.cuda.is_available():
        return
    if launcher != 'none':
        cfg.setdefault('env_cfg', {}).setdefault('dist_cfg', {})['backend'] = 'gloo'
        wrapper = copy.deepcopy(cfg.get('model_wrapper_cfg') or {})
        wrapper.setdefault('type', 'MMDistributedDataParallel')
        wrapper['device_ids'] = None
        if 'find_unused_parameters' in cfg:
            wrapper.setdefault('find_unused_parameters', cfg.find_unused_parameters)
        cfg.model_wrapper_cfg = wrapper
    optim_wrapper = cfg.get('optim_wrapper')
    if isinstance(optim_wrapper, dict) and optim_wrapper.get('type') == 'AmpOptimWrapper':
        print_log('No CUDA device: AmpOptimWrapper (mixed precision) replaced by OptimWrapper (fp32).',
                  logger='current', level=30)
        optim_wrapper['type'] = 'OptimWrapper'
        for key in ('loss_scale', 'dtype'):
            optim_wrapper.pop(key, None)
    if 'model' in cfg:
        replaced = _replace_sync_bn(cfg.model)
        if replaced:
            print_log(f'No CUDA device: {replaced} SyncBN norm config(s) replaced by BN.',
                      logger='current', level=30)


def init_distributed_if_cpu(launcher: str) -> None:
    """Initialise a gloo process group for ``--launcher pytorch`` on a CPU-only machine.

    mmengine's own initialisation calls ``torch.cuda.set_device``, which fails
    without a GPU; once the group exists, the Runner skips it.
    """
    if launcher == 'none' or torch.cuda.is_available() or dist.is_initialized():
        return
    if launcher != 'pytorch':
        raise ValueError(f"on a machine without CUDA only --launcher 'pytorch' (torchrun) or 'none' "
                         f"is supported, got {launcher!r}")
    dist.init_process_group(backend='gloo', rank=int(os.environ['RANK']),
                            world_size=int(os.environ['WORLD_SIZE']))


def shutdown_distributed() -> None:
    """Destroy the process group at the end of a run.

    Left to interpreter exit, the gloo group's threads can abort the process
    ("terminate called without an active exception") after a successful run.
    """
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
