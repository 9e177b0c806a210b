"""Parameters and FLOPs of the model a config builds.

    python tools/analysis_tools/get_flops.py configs/classification/polapp-b0_8xb256_in1k.py
    python tools/analysis_tools/get_flops.py CONFIG --shape 800 1280 --table

FLOPs count one multiply-accumulate as one FLOP (fvcore/mmengine convention),
softmax attention included. Classifiers are counted end to end (logits),
detectors and segmentors through their tensor-mode forward (backbone, neck
and heads, without post-processing). Runs on the CPU.
"""
import argparse
import os.path as osp

import torch
from mmengine.config import Config, DictAction
from mmengine.registry import init_default_scope

from polaformerpp.analysis import count_complexity
from polaformerpp.utils.cli import image_shape, parser_errors, run_cli

DEFAULT_SHAPES = dict(mmpretrain=(224, 224), mmdet=(800, 1280), mmseg=(512, 2048))
SR_DEFAULT_SHAPE = (180, 320)  # LR input of a 1280x720 output at x4


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Count parameters and FLOPs of a config')
    parser.add_argument('config', help='config file path')
    parser.add_argument('--shape', type=int, nargs='+', default=None,
                        help='input H W (or one size for a square); default per task '
                        '(224 classification, 800x1280 detection, 512x2048 segmentation, '
                        '180x320 LR input for super-resolution; DiT: its latent size, --shape ignored)')
    parser.add_argument('--table', action='store_true', help='print the per-module table')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config entries')
    args = parser.parse_args(argv)
    if not osp.isfile(args.config):
        parser.error(f'config: {args.config} not found')
    with parser_errors(parser):
        args.shape = image_shape(args.shape)
    return args


def _data_samples(scope: str, shape):
    """One data sample with the meta information detectors/segmentors read in tensor mode."""
    h, w = shape
    meta = dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w), batch_input_shape=(h, w),
                scale_factor=(1.0, 1.0))
    if scope == 'mmdet':
        from mmdet.structures import DetDataSample
        return [DetDataSample(metainfo=meta)]
    if scope == 'mmseg':
        from mmseg.structures import SegDataSample
        return [SegDataSample(metainfo=meta)]
    return None


def _dit_flops(cfg, show_table):
    """One forward of the DiT noise predictor on a latent of its configured size (VAE not counted)."""
    from mmengine.registry import MODELS
    dit = MODELS.build(cfg.model.dit).eval()
    x = torch.randn(1, dit.in_channels, *dit.input_size)
    t, y = torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long)
    with torch.no_grad():
        result = count_complexity(dit, (x, t, y), show_table=show_table)
    result['params'] = sum(p.numel() for p in dit.parameters())
    result['shape'] = tuple(dit.input_size)
    result['in_channels'] = dit.in_channels
    return result


def get_flops(config, shape=None, cfg_options=None, show_table=False):
    """Returns ``dict(flops, params, shape, by_operator[, table])`` for the config's model.

    ``shape``: ``(H, W)``, one size, or ``None`` for the task's default.
    """
    shape = image_shape(shape)  # an impossible shape fails before the model is built
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    scope = cfg.get('default_scope', 'mmpretrain')
    if scope is not None:  # pure-mmengine configs (super-resolution, generation) may have none
        init_default_scope(scope)
    if 'custom_imports' in cfg:
        from mmengine.utils import import_modules_from_strings
        import_modules_from_strings(**cfg.custom_imports)
    if 'dit' in cfg.model:  # latent diffusion: one step of the noise predictor
        return _dit_flops(cfg, show_table)
    if shape is None:
        is_sr = 'upscale' in cfg.model.get('network', {})
        shape = SR_DEFAULT_SHAPE if is_sr else DEFAULT_SHAPES.get(scope, (224, 224))
    from mmengine.registry import MODELS
    model_cfg = cfg.model
    model_cfg.pop('pretrained', None)
    model = MODELS.build(model_cfg).eval()
    inputs = torch.randn(1, 3, *shape)
    data_samples = _data_samples(scope, shape)

    class TensorForward(torch.nn.Module):
        """Wraps the model so the tracer sees a plain tensor-in, tensors-out call."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(x, data_samples, mode='tensor')

    with torch.no_grad():
        result = count_complexity(TensorForward(model), (inputs, ), show_table=show_table)
    result['params'] = sum(p.numel() for p in model.parameters())
    result['shape'] = shape
    return result


def main(argv=None):
    args = parse_args(argv)
    result = get_flops(args.config, args.shape, args.cfg_options, args.table)
    if args.table:
        print(result['table'])
    split = '=' * 40
    print(f"{split}\nInput shape: ({result.get('in_channels', 3)}, {result['shape'][0]}, {result['shape'][1]})\n"
          f"Flops: {result['flops'] / 1e9:.3f}G\nParams: {result['params'] / 1e6:.3f}M "
          f"({result['params']:,})\n{split}")


if __name__ == '__main__':
    run_cli(main)
