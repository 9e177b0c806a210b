"""Evaluate a checkpoint with mmengine's Runner and the config's test evaluator.

Examples::

    python tools/test.py CONFIG CHECKPOINT
    python tools/test.py CONFIG CHECKPOINT --tta            # config's tta_model/tta_pipeline
    python tools/test.py CONFIG CHECKPOINT --allow-partial  # evaluate although keys are missing
    python tools/test.py CONFIG CHECKPOINT --out results.pkl --out-json metrics.json
    python tools/test.py CONFIG CHECKPOINT --compile        # torch.compile the test step (inductor)
    bash tools/dist_test.sh CONFIG CHECKPOINT 8
    bash tools/slurm_test.sh PARTITION JOB CONFIG CHECKPOINT   # srun, GPUS=8 tasks by default
"""
import argparse
import json
import numbers
import os
import os.path as osp
import sys

import torch
from mmengine.config import Config, DictAction
from mmengine.evaluator import DumpResults
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from polaformerpp.engine.compile import (
    CompileUnavailableError,
    check_compile_support,
    compile_method,
    compile_options,
)
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
from polaformerpp.utils.checkpoint import ALLOW_PARTIAL_HELP, UNSAFE_LOAD_HELP


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Test (evaluate) a checkpoint')
    parser.add_argument('config', help='config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='directory for the evaluation logs')
    parser.add_argument('--allow-partial', action='store_true', help=ALLOW_PARTIAL_HELP)
    parser.add_argument('--unsafe-load', action='store_true', help=UNSAFE_LOAD_HELP)
    parser.add_argument('--out', help='dump raw predictions to this pickle file')
    parser.add_argument('--out-json', help='write the final metrics to this JSON file')
    parser.add_argument('--save-dir', help='super-resolution: write the SR outputs as PNG here')
    parser.add_argument('--tta', action='store_true',
                        help="test-time augmentation from the config's tta_model and tta_pipeline")
    parser.add_argument('--compile', action='store_true',
                        help='torch.compile the test step (with the options of the config\'s `compile` key when it '
                             'is a dict; the first batches compile, which takes minutes)')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
        help='override config entries, e.g. test_dataloader.batch_size=1')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none',
                        help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def merge_args(cfg, args):
    apply_common_args(cfg, args)
    if not osp.isfile(args.checkpoint):
        raise FileNotFoundError(f'checkpoint not found: {args.checkpoint}')
    cfg.load_from = args.checkpoint
    if args.save_dir is not None:
        if 'save_sr' not in cfg.get('default_hooks', {}):
            raise ValueError('--save-dir needs default_hooks.save_sr (SaveSRImagesHook) in the config')
        cfg.default_hooks.save_sr.save_dir = args.save_dir
    if args.tta:
        if 'tta_model' not in cfg or 'tta_pipeline' not in cfg:
            raise ValueError('--tta needs tta_model and tta_pipeline in the config')
        cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
        cfg.tta_model.module = cfg.model
        cfg.model = cfg.tta_model
    adapt_cfg_to_device(cfg, args.launcher)
    return cfg


def main(argv=None):
    args = parse_args(argv)
    set_unsafe_loading(args.unsafe_load)
    cfg = merge_args(Config.fromfile(args.config), args)
    options = (compile_options(cfg.get('compile')) or {}) if args.compile else None
    try:
        check_compile_support(options, 'cuda' if torch.cuda.is_available() else 'cpu')
    except CompileUnavailableError as error:
        sys.stderr.write(f'test.py: error: {error}\n')
        raise SystemExit(1) from None
    init_distributed_if_cpu(args.launcher, dist_timeout(cfg))
    runner = RUNNERS.build(cfg) if 'runner_type' in cfg else Runner.from_cfg(cfg)
    freeze_long_lived_objects()
    if options is not None:
        compile_method(runner.model, 'test_step', options)
    # refuse (before evaluating) a checkpoint that leaves the model half-initialised
    runner.register_hook(StrictLoadHook(strict=True, allow_partial=args.allow_partial, filename=args.checkpoint))
    if args.out is not None:
        if not args.out.endswith(('.pkl', '.pickle')):
            raise ValueError(f'--out must be a .pkl file, got {args.out}')
        # gathered (in a distributed run) under the work dir, as PolaRunner does for the config's metrics
        runner.test_evaluator.metrics.append(DumpResults(
            out_file_path=args.out, collect_dir=osp.join(runner.log_dir, '.collect-dump-results')))
    metrics = runner.test()
    if args.out_json is not None and runner.rank == 0:
        with open(args.out_json, 'w') as f:
            json.dump({k: float(v) if isinstance(v, numbers.Real) else str(v)
                       for k, v in metrics.items()}, f, indent=2)
    shutdown_distributed()
    return metrics


if __name__ == '__main__':
    run_tool_main(main)
    exit_after_distributed_run()
