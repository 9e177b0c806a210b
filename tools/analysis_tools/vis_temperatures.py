"""Learned channel-wise temperatures of every PolaFormer++ attention layer (the paper's Fig. 3).

Each linear attention layer learns ``s1``, ``s2`` (``(h, 2d)``, used as
sigmoids): the same-polarity stream scales ``[q+, q-]`` by ``sigmoid(s1)``,
the opposite-polarity stream ``[q-, q+]`` by ``sigmoid(s2)``. Paired per query
channel, every layer gets two scatter plots with the ``y = x`` line:

* same stream (x) vs opposite stream (y), for the q+ and the q- half
  (one colour each);
* q+ half (x) vs q- half (y), for the same and the opposite stream.

All points start at (0.5, 0.5) (``s = 0``); how far training moves them off
the diagonal is summarised per layer and pair: means, ``mean |x - y|``,
``max |x - y|`` and the fraction above the diagonal (``y > x``).

Outputs in ``--out-dir``: ``temperatures.png`` and ``temperatures.json``.

Example::

    python tools/analysis_tools/vis_temperatures.py CONFIG CHECKPOINT --out-dir work_dirs/vis
"""
import argparse
import json
import math
import os
import os.path as osp

from mmengine.config import DictAction

from polaformerpp.analysis import (
    agg_pyplot,
    load_model,
    pola_attention_modules,
    short_layer_name,
    temperature_pairs,
    temperature_summary,
)
from polaformerpp.utils.checkpoint import ALLOW_PARTIAL_HELP, UNSAFE_LOAD_HELP, exit_on_checkpoint_error
from polaformerpp.utils.cli import existing_file, parser_errors, run_cli

PANELS = (('same stream vs opposite stream', ('q+: same vs opp', 'q-: same vs opp'),
           'same-stream temperature', 'opposite-stream temperature'),
          ('q+ half vs q- half', ('same: q+ vs q-', 'opp: q+ vs q-'),
           'temperature on q+', 'temperature on q-'))
LAYERS_PER_ROW = 4


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Scatter the learned PolaFormer++ temperatures')
    parser.add_argument('config', help='config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--allow-partial', action='store_true', help=ALLOW_PARTIAL_HELP)
    parser.add_argument('--unsafe-load', action='store_true', help=UNSAFE_LOAD_HELP)
    parser.add_argument('--out-dir', default='work_dirs/vis_temperatures', help='where the PNG/JSON go')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config entries')
    args = parser.parse_args(argv)
    with parser_errors(parser):
        existing_file(args.config, 'config')
        existing_file(args.checkpoint, 'checkpoint')
    return args


def format_summary(summaries) -> str:
    header = ['layer', 'pair', 'mean x', 'mean y', 'mean|x-y|', 'max|x-y|', 'P(y>x)']
    lines = [[short_layer_name(layer), pair, f"{s['mean_x']:.4f}", f"{s['mean_y']:.4f}",
              f"{s['mean_abs_gap']:.4f}", f"{s['max_abs_gap']:.4f}", f"{s['frac_above']:.2f}"]
             for layer, pairs in summaries.items() for pair, s in pairs.items()]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    fmt = '  '.join('{:<%d}' % w if i < 2 else '{:>%d}' % w for i, w in enumerate(widths))
    return '\n'.join([fmt.format(*header), fmt.format(*('-' * w for w in widths))] +
                     [fmt.format(*line) for line in lines])


def plot(layers, path, title):
    plt = agg_pyplot()
    cols = min(LAYERS_PER_ROW, len(layers))
    rows = math.ceil(len(layers) / cols)
    fig, axes = plt.subplots(rows, 2 * cols, figsize=(5.2 * cols, 2.7 * rows + 0.6), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    for index, (name, pairs) in enumerate(layers):
        for p, (panel_title, keys, xlabel, ylabel) in enumerate(PANELS):
            ax = axes[index // cols, 2 * (index % cols) + p]
            ax.set_visible(True)
            values = []
            for key, colour in zip(keys, ('tab:blue', 'tab:orange')):
                x, y = pairs[key]
                ax.scatter(x.numpy(), y.numpy(), s=6, alpha=0.6, color=colour, label=key.split(':')[0])
                values += [float(x.min()), float(x.max()), float(y.min()), float(y.max())]
            low, high = min(values), max(values)
            pad = max(0.02, 0.05 * (high - low))
            low, high = max(0.0, low - pad), min(1.0, high + pad)
            ax.plot([low, high], [low, high], 'k--', linewidth=0.8)
            ax.set_xlim(low, high)
            ax.set_ylim(low, high)
            ax.set_aspect('equal')
            ax.set_title(f'{short_layer_name(name)}\n{panel_title}', fontsize=7)
            ax.set_xlabel(xlabel, fontsize=7)
            ax.set_ylabel(ylabel, fontsize=7)
            ax.tick_params(labelsize=6)
            ax.legend(fontsize=6, markerscale=2)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    model = load_model(args.config, args.checkpoint, args.cfg_options, 'cpu',
                       allow_partial=args.allow_partial, unsafe_load=args.unsafe_load)
    modules = pola_attention_modules(model)
    if not modules:
        raise ValueError(f'{args.config} builds no PolaFormer++ linear attention layer')
    layers = [(name, temperature_pairs(module)) for name, module in modules]
    summaries = {name: temperature_summary(pairs) for name, pairs in layers}

    print('Learned temperatures sigmoid(s1) (same stream), sigmoid(s2) (opposite stream), '
          'paired per query channel')
    print(format_summary(summaries))
    os.makedirs(args.out_dir, exist_ok=True)
    png = osp.join(args.out_dir, 'temperatures.png')
    plot(layers, png, f'channel-wise temperatures: {osp.basename(args.checkpoint)}')
    with open(osp.join(args.out_dir, 'temperatures.json'), 'w') as f:
        json.dump(dict(summary=summaries,
                       values={name: {key: [x.tolist(), y.tolist()] for key, (x, y) in pairs.items()}
                               for name, pairs in layers}), f)
    print(f'Saved {png}')
    return summaries


if __name__ == '__main__':
    exit_on_checkpoint_error(lambda argv: run_cli(main, argv))
