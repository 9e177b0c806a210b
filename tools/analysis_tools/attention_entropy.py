"""Entropy of the attention distributions of PolaFormer++ vs softmax and kernel linear attention.

For a checkpoint and a few images (or random inputs) the model runs once; the
queries and keys every PolaFormer++ linear attention layer sees are recorded
(forward pre-hooks re-running the layer's projection) and, per layer and
head, the mean entropy of each query's attention distribution over all keys is
reported for:

* ``pola-same`` / ``pola-opp``: the two polarity streams of PolaFormer++ as
  the layer computes them (the exact ``N x N`` matrices its output equals,
  RoPE included when the layer uses it);
* ``softmax``: ``softmax(q k^T / sqrt(d))`` on the same q, k;
* ``relu``: ReLU linear attention ``relu(q) relu(k)^T``, row-normalised;
* ``elu+1``: ``(elu(q)+1) (elu(k)+1)^T``, row-normalised.

How the weights are normalised. Each row ``w`` (one query, all ``N`` keys) is
made a distribution by magnitude, ``p = |w| / sum |w|``, and its entropy is
``H = -sum p log p`` in nats (``0 log 0 = 0``; ``log N`` = uniform). Softmax
and kernel attention are non-negative, so this is their usual normalisation,
and PolaFormer++ without RoPE is too (its rows sum to 1 up to the op's eps).
With RoPE, PolaFormer++ rotates the numerator only: its effective weights do
not sum to 1 and some are negative. They enter the entropy by magnitude, and
the fraction of each row's magnitude that is negative,
``sum max(-w, 0) / sum |w|``, is reported in the ``neg`` columns (0 without
RoPE; ``--no-rope`` removes the rotation to compare). A row with no weight at
all (ReLU attention when a query shares no positive channel with any key; an
opposite-polarity stream with no opposite-signed pair) has no distribution: it
is left out of the mean and counted under ``zero rows``. Lower entropy =
spikier attention. Large layers are sampled: ``--max-queries`` evenly spaced
queries (rows), each over all keys. A progress bar over the layers goes to
stderr when it is a terminal (``--no-progress`` or ``POLAPP_NO_PROGRESS=1``:
none).

Outputs: the table on stdout, and in ``--out-dir`` ``attention_entropy.png``
(entropy / log N per layer, mean over heads and images, per method; the
negative-mass fraction of the two PolaFormer++ streams) and
``attention_entropy.json`` (every row of the table).

Examples::

    python tools/analysis_tools/attention_entropy.py CONFIG CHECKPOINT --img demo/*.jpg
    python tools/analysis_tools/attention_entropy.py CONFIG CHECKPOINT --num-random 4 --shape 224
"""
import argparse
import json
import math
import os
import os.path as osp
from collections import OrderedDict

import torch
from mmengine.config import DictAction

from polaformerpp.analysis import (
    METHODS,
    AttentionRecorder,
    agg_pyplot,
    entropy_table,
    format_entropy_table,
    load_images,
    load_model,
    run_model,
    short_layer_name,
)
from polaformerpp.utils.checkpoint import ALLOW_PARTIAL_HELP, UNSAFE_LOAD_HELP, exit_on_checkpoint_error
from polaformerpp.utils.cli import (
    existing_file,
    existing_path,
    image_shape,
    non_negative_int,
    parser_errors,
    positive_int,
    run_cli,
    torch_device,
)
from polaformerpp.utils.progress import add_progress_argument, progress_from_args


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Attention entropy of PolaFormer++ vs softmax, '
                                     'ReLU and 1+ELU attention on the same queries and keys')
    parser.add_argument('config', help='config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--allow-partial', action='store_true', help=ALLOW_PARTIAL_HELP)
    parser.add_argument('--unsafe-load', action='store_true', help=UNSAFE_LOAD_HELP)
    parser.add_argument('--img', nargs='+', default=[],
                        help='image files or folders (default: random inputs)')
    parser.add_argument('--num-random', type=positive_int, default=2,
                        help='random images when no --img is given')
    parser.add_argument('--shape', type=int, nargs='+', default=[224], help='input H W (or one size)')
    parser.add_argument('--methods', nargs='+', choices=METHODS, default=list(METHODS))
    parser.add_argument('--max-queries', type=non_negative_int, default=1024,
                        help='queries (rows) sampled per layer; 0 for all')
    parser.add_argument('--no-rope', action='store_true',
                        help='PolaFormer++ weights without the RoPE rotation (non-negative)')
    parser.add_argument('--out-dir', default='work_dirs/attention_entropy', help='where the PNG/JSON go')
    parser.add_argument('--device', type=torch_device, default='cpu')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config entries')
    add_progress_argument(parser)
    args = parser.parse_args(argv)
    with parser_errors(parser):
        args.shape = list(image_shape(args.shape))
        existing_file(args.config, 'config')
        existing_file(args.checkpoint, 'checkpoint')
        for path in args.img:
            existing_path(path, '--img')
    return args


def layer_means(rows, methods):
    """``layer -> method -> mean over heads`` of entropy / log N, and negative mass."""
    layers = OrderedDict()
    for row in rows:
        layers.setdefault(row['layer'], []).append(row)
    means = OrderedDict()
    for layer, layer_rows in layers.items():
        means[layer] = {}
        for method in methods:
            for key in (f'{method}/norm', f'{method}/neg'):
                values = [r[key] for r in layer_rows if not math.isnan(r[key])]
                means[layer][key] = sum(values) / len(values) if values else float('nan')
    return means


def plot(rows, methods, path, title):
    plt = agg_pyplot()
    means = layer_means(rows, methods)
    names = [short_layer_name(name) for name in means]
    x = list(range(len(names)))
    pola = [m for m in methods if m.startswith('pola')]
    fig, axes = plt.subplots(1, 2 if pola else 1, figsize=(6 + 0.5 * len(names), 4.2), squeeze=False)
    ax = axes[0, 0]
    for method in methods:
        ax.plot(x, [means[n][f'{method}/norm'] for n in means], marker='o', label=method)
    ax.set_ylabel('entropy / log N  (1 = uniform)')
    ax.set_title('attention entropy per layer')
    ax.legend(fontsize=8)
    if pola:
        ax2 = axes[0, 1]
        for method in pola:
            ax2.plot(x, [means[n][f'{method}/neg'] for n in means], marker='s', label=method)
        ax2.set_ylabel('negative-mass fraction')
        ax2.set_title('negative weights (RoPE), PolaFormer++')
        ax2.legend(fontsize=8)
    for a in axes[0]:
        a.set_xticks(x)
        a.set_xticklabels(names, rotation=45, ha='right', fontsize=7)
        a.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    model = load_model(args.config, args.checkpoint, args.cfg_options, args.device,
                       allow_partial=args.allow_partial, unsafe_load=args.unsafe_load)
    images, names = load_images(args.img, tuple(args.shape), args.num_random)
    with AttentionRecorder(model) as recorder:
        run_model(model, images)
    rope = False if args.no_rope else None
    rows = entropy_table(recorder.captures, args.methods, args.max_queries or None, rope,
                         progress=progress_from_args(args))

    print(f'Attention entropy (nats; mean over {len(images)} image(s) and up to '
          f'{args.max_queries or "all"} queries per layer; log N = uniform)')
    print(format_entropy_table(rows, args.methods))
    overall = {m: [r[m] for r in rows if not math.isnan(r[m])] for m in args.methods}
    print('mean over layers and heads: ' + ', '.join(
        f'{m} {sum(v) / len(v):.3f}' if v else f'{m} n/a' for m, v in overall.items()))

    os.makedirs(args.out_dir, exist_ok=True)
    png = osp.join(args.out_dir, 'attention_entropy.png')
    plot(rows, args.methods, png, f'{osp.basename(args.checkpoint)} ({len(images)} image(s), '
         f'{args.shape[0]}x{args.shape[1]}{", no RoPE" if args.no_rope else ""})')
    with open(osp.join(args.out_dir, 'attention_entropy.json'), 'w') as f:
        json.dump(dict(images=names, shape=args.shape, rope=not args.no_rope, rows=rows), f, indent=1)
    print(f'Saved {png}')
    return rows


if __name__ == '__main__':
    torch.set_grad_enabled(False)
    exit_on_checkpoint_error(lambda argv: run_cli(main, argv))
