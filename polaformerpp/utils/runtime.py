"""Run-time adjustments the project's tools apply before building an mmengine Runner.

They keep mmengine 0.10.7 working on current torch and on machines without a
GPU, without touching installed packages:

* Checkpoints load safely (``weights_only=True``) with the types of the
  Runner's own checkpoints allowed; that lives in :mod:`polaformerpp.utils.checkpoint`
  (registered at ``import polaformerpp``), with the explicit ``--unsafe-load`` opt-in.
* On a CPU-only machine, distributed runs use gloo, DDP gets ``device_ids=None``,
  mixed precision falls back to fp32 and SyncBN to BN (each logged). That holds
  for torchrun (``--launcher pytorch``) and for Slurm's srun (``--launcher slurm``),
  whose task variables are translated to torch's (:func:`slurm_dist_env`).
* ``--tensorboard`` adds mmengine's ``TensorboardVisBackend`` to the config's
  visualizer (:func:`add_tensorboard_backend`).
* Distributed runs get a bounded collective timeout (:func:`apply_dist_timeout`):
  a collective that cannot complete (a peer gone or frozen, ranks out of step)
  fails after ``env_cfg.dist_cfg.timeout`` seconds instead of gloo's and NCCL's
  30 minutes.
* Once the Runner is built, what the process holds is moved out of the garbage
  collector's full passes (:func:`freeze_long_lived_objects`).
"""
import copy
import gc
import logging
import os
import os.path as osp
import shutil
import subprocess
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from mmengine.logging import print_log

__all__ = [
    'apply_common_args', 'adapt_cfg_to_device', 'DEFAULT_DIST_TIMEOUT', 'DIST_TIMEOUT_ENV', 'apply_dist_timeout',
    'dist_timeout',
    'init_distributed_if_cpu', 'shutdown_distributed', 'slurm_dist_env', 'add_tensorboard_backend',
    'freeze_long_lived_objects'
]

#: the environment variable that sets the collective timeout (seconds) of the tools' distributed runs
DIST_TIMEOUT_ENV = 'POLAPP_DIST_TIMEOUT'
#: its default: 10 minutes. It must outlast the longest wait of a healthy rank at a collective, which is
#: rank 0 alone writing a checkpoint or computing a COCO-style metric while the others wait at the next
#: collective (minutes on a large validation set), and it bounds how long a lost peer can hang the job.
DEFAULT_DIST_TIMEOUT = 600


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
    if cfg.launcher != 'none':
        apply_dist_timeout(cfg)


def _positive_seconds(value, source: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float('nan')
    if not seconds > 0 or seconds == float('inf'):
        raise ValueError(f'{source}: the collective timeout must be a positive number of seconds, got {value!r}')
    return seconds


def apply_dist_timeout(cfg, environ=None) -> float:
    """Set ``cfg.env_cfg.dist_cfg.timeout`` (seconds, in place) unless the config sets it; returns it.

    The config's value (also given as ``--cfg-options env_cfg.dist_cfg.timeout=N``)
    comes first, then the ``POLAPP_DIST_TIMEOUT`` environment variable, then
    :data:`DEFAULT_DIST_TIMEOUT`. mmengine passes the value to
    ``init_process_group`` (and :func:`init_distributed_if_cpu` does on CPU).

    Raises:
        ValueError: the value is not a positive number of seconds (naming where it came from).
    """
    environ = os.environ if environ is None else environ
    dist_cfg = cfg.setdefault('env_cfg', {}).setdefault('dist_cfg', {})
    if dist_cfg.get('timeout') is not None:
        seconds = _positive_seconds(dist_cfg['timeout'], 'env_cfg.dist_cfg.timeout')
    elif environ.get(DIST_TIMEOUT_ENV, '').strip():
        seconds = _positive_seconds(environ[DIST_TIMEOUT_ENV], DIST_TIMEOUT_ENV)
    else:
        seconds = DEFAULT_DIST_TIMEOUT
    dist_cfg['timeout'] = seconds
    return seconds


def dist_timeout(cfg) -> float:
    """The collective timeout of ``cfg`` in seconds (:data:`DEFAULT_DIST_TIMEOUT` when it sets none)."""
    timeout = ((cfg.get('env_cfg') or {}).get('dist_cfg') or {}).get('timeout')
    return DEFAULT_DIST_TIMEOUT if timeout is None else _positive_seconds(timeout, 'env_cfg.dist_cfg.timeout')


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


def slurm_dist_env(environ=None) -> dict:
    """torch.distributed's rendezvous variables for one task started by Slurm's ``srun``.

    Reads ``SLURM_PROCID`` (the rank), ``SLURM_NTASKS`` (the world size),
    ``SLURM_LOCALID`` (the rank on its node; defaults to 0) and, unless
    ``MASTER_ADDR`` is already set, the first host of ``SLURM_NODELIST``
    (through ``scontrol show hostname``, as on any Slurm node). ``MASTER_PORT``
    is kept when set and is 29500 otherwise, as in mmengine's own Slurm setup.

    Args:
        environ (Mapping, optional): the variables to read; ``os.environ`` by default.

    Returns:
        dict: ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``,
        ``LOCAL_RANK``, all as strings.
    """
    environ = os.environ if environ is None else environ
    values = {}
    for name in ('SLURM_PROCID', 'SLURM_NTASKS'):
        if name not in environ:
            raise KeyError(f'--launcher slurm needs {name} in the environment (set by srun); '
                           f'start the tool through srun, e.g. tools/slurm_train.sh')
        try:
            values[name] = int(environ[name])
        except ValueError:
            raise ValueError(f'{name} must be an integer, got {environ[name]!r}') from None
    local_rank = environ.get('SLURM_LOCALID', '0')
    if not str(local_rank).isdigit():
        raise ValueError(f'SLURM_LOCALID must be an integer, got {local_rank!r}')
    rank, world_size = values['SLURM_PROCID'], values['SLURM_NTASKS']
    if not 0 <= rank < world_size:
        raise ValueError(f'SLURM_PROCID must be in [0, SLURM_NTASKS={world_size}), got {rank}')
    addr = environ.get('MASTER_ADDR') or _first_slurm_host(environ.get('SLURM_NODELIST'))
    return dict(MASTER_ADDR=addr, MASTER_PORT=str(environ.get('MASTER_PORT') or 29500), RANK=str(rank),
                WORLD_SIZE=str(world_size), LOCAL_RANK=str(int(local_rank)))


def _first_slurm_host(node_list):
    """The first host name of a Slurm node list such as ``node[01-04]``, via ``scontrol``."""
    if not node_list:
        raise KeyError('--launcher slurm needs SLURM_NODELIST (set by srun) or MASTER_ADDR in the environment')
    if shutil.which('scontrol') is None:
        raise RuntimeError(f'cannot resolve SLURM_NODELIST={node_list!r}: scontrol is not on PATH; '
                           f'set MASTER_ADDR to the first node\'s address')
    proc = subprocess.run(['scontrol', 'show', 'hostname', node_list], capture_output=True, text=True)
    hosts = proc.stdout.split()
    if proc.returncode != 0 or not hosts:
        raise RuntimeError(f'scontrol show hostname {node_list} failed (exit {proc.returncode}): '
                           f'{proc.stderr.strip()}; set MASTER_ADDR to the first node\'s address')
    return hosts[0]


def init_distributed_if_cpu(launcher: str, timeout: float = DEFAULT_DIST_TIMEOUT) -> None:
    """Initialise a gloo process group for ``--launcher pytorch`` or ``slurm`` on a CPU-only machine.

    mmengine's own initialisation calls ``torch.cuda.set_device``, which fails
    without a GPU; once the group exists, the Runner skips it. ``timeout``
    (seconds) bounds every collective of the group. For ``slurm``
    the task's Slurm variables are first exported as torch's
    (:func:`slurm_dist_env`), so code that reads ``RANK``/``LOCAL_RANK`` sees them.
    """
    if launcher == 'none' or torch.cuda.is_available() or dist.is_initialized():
        return
    if launcher == 'slurm':
        os.environ.update(slurm_dist_env())
    elif launcher != 'pytorch':
        raise ValueError(f"on a machine without CUDA only --launcher 'pytorch' (torchrun), 'slurm' (srun) "
                         f"or 'none' is supported, got {launcher!r}")
    dist.init_process_group(backend='gloo', init_method='env://', rank=int(os.environ['RANK']),
                            world_size=int(os.environ['WORLD_SIZE']), timeout=timedelta(seconds=timeout))


def add_tensorboard_backend(cfg) -> None:
    """Append mmengine's ``TensorboardVisBackend`` to ``cfg.visualizer.vis_backends`` (in place).

    The other backends (``LocalVisBackend``, ...) are kept; a config that
    already has a TensorBoard backend is left as it is. Works with any
    visualizer type (mmpretrain's ``UniversalVisualizer``, mmdet's
    ``DetLocalVisualizer``, mmseg's ``SegLocalVisualizer``, mmengine's
    ``Visualizer``); the events files go to ``<work_dir>/<timestamp>/vis_data``.
    """
    visualizer = cfg.get('visualizer')
    if not isinstance(visualizer, dict):
        raise ValueError('--tensorboard needs a `visualizer` dict with `vis_backends` in the config, '
                         f'got visualizer={visualizer!r}')
    backends = visualizer.get('vis_backends')
    if backends is None:
        backends = []
    elif isinstance(backends, dict):
        backends = [backends]
    elif isinstance(backends, (list, tuple)):
        backends = list(backends)
    else:
        raise ValueError(f'--tensorboard: visualizer.vis_backends must be a list of dicts, got {backends!r}')
    if not any(isinstance(b, dict) and str(b.get('type', '')).split('.')[-1] == 'TensorboardVisBackend'
               for b in backends):
        backends.append(dict(type='TensorboardVisBackend'))
    visualizer['vis_backends'] = backends


def freeze_long_lived_objects() -> None:
    """Move every object the process holds now out of the garbage collector's sight (``gc.freeze``).

    Called by the tools once the Runner is built: the libraries are imported and
    the model exists, and all of it lives as long as the process. A full
    collection then no longer walks it: mmengine's datasets run one each when
    they serialize their annotations (about 0.2 s with torch, mmdet and
    mmpretrain loaded, several times a run), and forked data workers do not
    copy the pages such a walk would touch. Objects freed by their reference
    count are freed as before; only cycles among the frozen objects stay.
    """
    gc.freeze()


def shutdown_distributed() -> None:
    """Destroy the process group at the end of a run.

    Left to interpreter exit, the gloo group's threads can abort the process
    ("terminate called without an active exception") after a successful run.
    """
    if dist.is_available() and dist.is_initialized():
        from .peers import stop_peer_watch
        dist.barrier()
        stop_peer_watch()
        dist.destroy_process_group()
        _DISTRIBUTED_RUN_ENDED[0] = True


_DISTRIBUTED_RUN_ENDED = [False]


def exit_after_distributed_run() -> None:
    """End a launched worker right after :func:`shutdown_distributed`, skipping static destructors.

    Even with the group destroyed, the C++ threads of gloo (and of the rendezvous
    store) can still be joinable when the interpreter tears down its statics,
    and ``std::terminate`` then aborts a worker whose run succeeded. A worker
    whose run ended cleanly flushes its logs and streams and leaves with
    ``os._exit(0)``; a process that never joined a group returns normally.
    """
    if not _DISTRIBUTED_RUN_ENDED[0]:
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
