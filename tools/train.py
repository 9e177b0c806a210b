"""Train a model from a config with mmengine's Runner.

Examples::

    python tools/train.py configs/classification/polapp-b0_8xb256_in1k.py
    python tools/train.py CONFIG --work-dir work_dirs/x --amp --cfg-options train_cfg.max_epochs=10
    python tools/train.py CONFIG --resume                  # latest checkpoint in the work dir
    python tools/train.py CONFIG --resume path/epoch_3.pth
    python tools/train.py CONFIG --unsafe-load --resume    # a trusted checkpoint that needs full unpickling
    python tools/train.py CONFIG --tensorboard             # also log to TensorBoard (vis_data/events.*)
    bash tools/dist_train.sh CONFIG 2 --accumulate 4       # 2 GPUs, the images per step of 8
    python tools/train.py CONFIG --compile                 # torch.compile the training step (inductor)
    bash tools/dist_train.sh CONFIG 8                      # torchrun, 8 processes
    bash tools/slurm_train.sh PARTITION JOB CONFIG WORK_DIR  # srun, GPUS=8 tasks by default
"""
import argparse
import importlib.util
import os
import os.path as osp
import sys

import torch
from mmengine.config import Config, DictAction
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from polaformerpp.engine.accumulation import apply_accumulation
from polaformerpp.engine.compile import CompileUnavailableError, check_compile_support, compile_options
from polaformerpp.utils import (
    StrictLoadHook,
    adapt_cfg_to_device,
    apply_common_args,
    dist_timeout,
    exit_after_distributed_run,
    freeze_long_lived_objects,
    init_distributed_if_cpu,
    run_tool_main,
    set_unsafe_loading,
    shutdown_distributed,
)
from polaformerpp.utils.checkpoint import UNSAFE_LOAD_HELP
from polaformerpp.utils.cli import positive_int
from polaformerpp.utils.runtime import add_tensorboard_backend


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Train a model')
    parser.add_argument('config', help='config file path')
    parser.add_argument('--work-dir', help='directory for logs and checkpoints')
    parser.add_argument(
        '--resume', nargs='?', const='auto', default=None,
        help='resume from the latest checkpoint in the work dir, or from the given checkpoint')
    parser.add_argument('--unsafe-load', action='store_true', help=UNSAFE_LOAD_HELP + ' (for --resume, '
                        'load_from and init_cfg=Pretrained alike)')
    parser.add_argument('--amp', action='store_true', help='automatic mixed precision (CUDA)')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale lr by the actual total batch over auto_scale_lr.base_batch_size')
    parser.add_argument(
        '--accumulate', type=positive_int, default=1, metavar='N',
        help='accumulate gradients over N iterations per optimizer step, so that G GPUs train with the images per '
             'step of N x G: iteration counts (max_iters, iteration-based schedulers, warm-ups, intervals) are '
             'multiplied by N, EMA updates once per step and --auto-scale-lr counts the accumulated batch')
    parser.add_argument('--no-validate', action='store_true', help='skip validation during training')
    parser.add_argument(
        '--tensorboard', action='store_true',
        help="also log to TensorBoard: appends mmengine's TensorboardVisBackend to visualizer.vis_backends, "
             'keeping the others (events files in WORK_DIR/<timestamp>/vis_data; needs the tensorboard '
             'package). --cfg-options cannot append a dict to a list: its nearest form, '
             'visualizer.vis_backends.0.type=TensorboardVisBackend, replaces the first backend instead')
    parser.add_argument(
        '--compile', action='store_true',
        help="torch.compile the training step (sets mmengine's `compile` config key, keeping its options if the "
             'config gives a dict; the first iterations compile, which takes minutes; validation stays eager)')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
        help='override config entries, e.g. model.backbone.arch=b1 train_cfg.max_epochs=5')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none',
                        help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def merge_args(cfg, args):
    apply_common_args(cfg, args)
    if args.amp:
        if not torch.cuda.is_available():
            raise ValueError('--amp needs a CUDA device (mixed precision runs through torch.cuda.amp)')
        optim_wrapper = cfg.optim_wrapper.get('type', 'OptimWrapper')
        if optim_wrapper not in ('OptimWrapper', 'AmpOptimWrapper'):
            raise ValueError(f'--amp works with OptimWrapper configs, got {optim_wrapper}')
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    if args.accumulate != 1:
        apply_accumulation(cfg, args.accumulate)
    if args.auto_scale_lr:
        if 'auto_scale_lr' not in cfg or 'base_batch_size' not in cfg.auto_scale_lr:
            raise ValueError('--auto-scale-lr needs auto_scale_lr.base_batch_size in the config')
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        if not osp.isfile(args.resume):
            raise FileNotFoundError(f'--resume checkpoint not found: {args.resume}')
        cfg.resume = True
        cfg.load_from = args.resume
    if args.no_validate:
        cfg.val_cfg = None
        cfg.val_dataloader = None
        cfg.val_evaluator = None
    if args.tensorboard:
        if importlib.util.find_spec('tensorboard') is None:
            raise ImportError('--tensorboard needs the tensorboard package: pip install tensorboard '
                              '(listed in requirements/optional.txt)')
        add_tensorboard_backend(cfg)
    if args.compile:
        cfg.compile = cfg.get('compile') or True
    adapt_cfg_to_device(cfg, args.launcher)
    return cfg


def check_compile(cfg, args):
    """End the run at once (stderr, exit 1) when the config asks for torch.compile and it cannot run here."""
    try:
        check_compile_support(compile_options(cfg.get('compile')), 'cuda' if torch.cuda.is_available() else 'cpu',
                              '--compile' if args.compile else 'compile (config key)')
    except CompileUnavailableError as error:
        sys.stderr.write(f'train.py: error: {error}\n')
        raise SystemExit(1) from None


def main(argv=None):
    args = parse_args(argv)
    set_unsafe_loading(args.unsafe_load)
    cfg = merge_args(Config.fromfile(args.config), args)
    check_compile(cfg, args)
    init_distributed_if_cpu(args.launcher, dist_timeout(cfg))
    runner = RUNNERS.build(cfg) if 'runner_type' in cfg else Runner.from_cfg(cfg)
    freeze_long_lived_objects()
    if cfg.get('load_from') and not cfg.get('resume', False):
        # fine-tuning stays lenient: one line says what was and was not loaded
        runner.register_hook(StrictLoadHook(strict=False, filename=cfg.load_from))
    runner.train()
    shutdown_distributed()


if __name__ == '__main__':
    run_tool_main(main)
    exit_after_distributed_run()
