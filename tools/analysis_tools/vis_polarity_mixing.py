"""How each PolaFormer++ layer mixes its two polarity streams (the paper's Fig. 4, G_s / G_o).

The attention output of a head is ``[same-polarity stream | opposite-polarity
stream]`` (``d/2`` channels each, over the two halves of the values); with the
LePE term and the gate it enters the output projection ``proj`` (``Linear(C,
C)``), whose input columns are the learned polarity mixing. Per layer the
columns are projected on their first two principal components and drawn as
points, one colour per stream. Printed per layer: the variance the two
components explain, the mean column norm of each stream (how strongly the
layer uses it) and the separation of the streams (distance between their mean
columns over the RMS spread of the columns around their stream's mean; ~0 when
the projection treats the two streams alike, as at initialisation).

Outputs in ``--out-dir``: ``polarity_mixing.png`` and ``polarity_mixing.json``.

Example::

    python tools/analysis_tools/vis_polarity_mixing.py CONFIG CHECKPOINT --out-dir work_dirs/vis
"""
import argparse
import json
import math
import os
import os.path as osp

from mmengine.config import DictAction

from polaformerpp.analysis import agg_pyplot, load_model, pola_attention_modules, polarity_mixing, short_layer_name
from polaformerpp.utils.checkpoint import ALLOW_PARTIAL_HELP, UNSAFE_LOAD_HELP, exit_on_checkpoint_error
from polaformerpp.utils.cli import existing_file, parser_errors, run_cli

LAYERS_PER_ROW = 4
STREAMS = (('same polarity', 'tab:red'), ('opposite polarity', 'tab:blue'))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='PCA of the polarity mixing of PolaFormer++ layers')
    parser.add_argument('config', help='config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--allow-partial', action='store_true', help=ALLOW_PARTIAL_HELP)
    parser.add_argument('--unsafe-load', action='store_true', help=UNSAFE_LOAD_HELP)
    parser.add_argument('--out-dir', default='work_dirs/vis_polarity_mixing', help='where the PNG/JSON go')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config entries')
    args = parser.parse_args(argv)
    with parser_errors(parser):
        existing_file(args.config, 'config')
        existing_file(args.checkpoint, 'checkpoint')
    return args


def plot(layers, path, title):
    plt = agg_pyplot()
    cols = min(LAYERS_PER_ROW, len(layers))
    rows = math.ceil(len(layers) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 3.2 * rows + 0.5), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    for index, (name, result) in enumerate(layers):
        ax = axes[index // cols, index % cols]
        ax.set_visible(True)
        coords, stream = result['coords'], result['stream']
        for s, (label, colour) in enumerate(STREAMS):
            points = coords[stream == s]
            ax.scatter(points[:, 0].numpy(), points[:, 1].numpy(), s=10, alpha=0.7, color=colour,
                       label=label)
        explained = result['explained'].tolist()
        ax.set_xlabel(f'PC1 ({100 * explained[0]:.0f}%)', fontsize=7)
        ax.set_ylabel(f'PC2 ({100 * explained[1]:.0f}%)', fontsize=7)
        ax.set_title(f"{short_layer_name(name)}  sep {result['separation']:.2f}", fontsize=8)
        ax.tick_params(labelsize=6)
        ax.axhline(0, color='0.8', linewidth=0.5)
        ax.axvline(0, color='0.8', linewidth=0.5)
        ax.legend(fontsize=6)
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
    layers = [(name, polarity_mixing(module)) for name, module in modules]

    header = f"{'layer':<28}{'PC1':>7}{'PC2':>7}{'|G_s| mean':>12}{'|G_o| mean':>12}{'separation':>12}"
    print('Output-projection columns of the same (G_s) and opposite (G_o) polarity streams')
    print(header + '\n' + '-' * len(header))
    summary = {}
    for name, result in layers:
        explained = result['explained'].tolist()
        print(f"{short_layer_name(name):<28}{explained[0]:>7.2f}{explained[1]:>7.2f}"
              f"{result['norm_same']:>12.4f}{result['norm_opp']:>12.4f}{result['separation']:>12.3f}")
        summary[name] = dict(explained=result['explained'].tolist(), norm_same=result['norm_same'],
                             norm_opp=result['norm_opp'], separation=result['separation'],
                             coords=result['coords'].tolist(), stream=result['stream'].tolist())
    os.makedirs(args.out_dir, exist_ok=True)
    png = osp.join(args.out_dir, 'polarity_mixing.png')
    plot(layers, png, f'polarity mixing (PCA of proj columns): {osp.basename(args.checkpoint)}')
    with open(osp.join(args.out_dir, 'polarity_mixing.json'), 'w') as f:
        json.dump(summary, f)
    print(f'Saved {png}')
    return summary


if __name__ == '__main__':
    exit_on_checkpoint_error(lambda argv: run_cli(main, argv))
