"""Where one query pixel attends: PolaFormer++ vs softmax attention, overlaid on the image.

The model runs once on the image; for every PolaFormer++ linear attention
layer (or those chosen with ``--layers``) the query pixel is mapped to the
layer's token grid and its attention distribution over all keys is drawn over
the image, for the two PolaFormer++ polarity streams (the exact weights the
layer applies, RoPE included) and for softmax attention on the same queries
and keys (more with ``--methods``). Each map is ``|w| / sum |w|`` (see
``attention_entropy.py``), averaged over heads (or ``--head``); its entropy
is in the panel title. The query is marked with a cross.

Output: ``attention_maps.png`` in ``--out-dir``. A progress bar over the
layers goes to stderr when it is a terminal (``--no-progress`` or
``POLAPP_NO_PROGRESS=1``: none).

Example::

    python tools/analysis_tools/vis_attention_maps.py CONFIG CHECKPOINT --img cat.jpg --query 120 80
"""
import argparse
import os
import os.path as osp

import torch
import torch.nn.functional as F
from mmengine.config import DictAction

from polaformerpp.analysis import (
    METHODS,
    AttentionRecorder,
    agg_pyplot,
    attention_map,
    load_images,
    load_model,
    run_model,
    short_layer_name,
)
from polaformerpp.utils.checkpoint import ALLOW_PARTIAL_HELP, UNSAFE_LOAD_HELP, exit_on_checkpoint_error
from polaformerpp.utils.cli import (
    ArgumentCheckError,
    existing_file,
    image_shape,
    non_negative_int,
    parser_errors,
    run_cli,
    torch_device,
)
from polaformerpp.utils.progress import add_progress_argument, progress_from_args, track


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Attention map of one query pixel, PolaFormer++ vs softmax')
    parser.add_argument('config', help='config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--allow-partial', action='store_true', help=ALLOW_PARTIAL_HELP)
    parser.add_argument('--unsafe-load', action='store_true', help=UNSAFE_LOAD_HELP)
    parser.add_argument('--img', help='image file (default: a random image)')
    parser.add_argument('--shape', type=int, nargs='+', default=[224], help='input H W (or one size)')
    parser.add_argument('--query', type=int, nargs=2, metavar=('X', 'Y'), default=None,
                        help='query pixel (column, row) in the resized input; default: the centre')
    parser.add_argument('--layers', nargs='+', default=None,
                        help='layer names (as printed, e.g. stages.0.blocks.1) or indices among '
                        'the linear attention layers; default: all')
    parser.add_argument('--methods', nargs='+', choices=METHODS, default=['pola-same', 'pola-opp', 'softmax'])
    parser.add_argument('--head', type=non_negative_int, default=None,
                        help='one head instead of the mean over heads')
    parser.add_argument('--no-rope', action='store_true', help='PolaFormer++ weights without RoPE')
    parser.add_argument('--out-dir', default='work_dirs/vis_attention_maps', help='where the PNG goes')
    parser.add_argument('--device', type=torch_device, default='cpu')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config entries')
    add_progress_argument(parser)
    args = parser.parse_args(argv)
    with parser_errors(parser):
        args.shape = list(image_shape(args.shape))
        check_query(args.query, args.shape)
        existing_file(args.config, 'config')
        existing_file(args.checkpoint, 'checkpoint')
        if args.img:
            existing_file(args.img, '--img')
    return args


def check_query(query, shape) -> None:
    """``--query X Y`` must be a pixel of the ``H x W`` input."""
    if query is None:
        return
    (x, y), (height, width) = query, shape
    if not (0 <= x < width and 0 <= y < height):
        raise ArgumentCheckError(f'--query ({x}, {y}) is outside the {width}x{height} input '
                                 f'(X in [0, {width - 1}], Y in [0, {height - 1}])')


def select_layers(captures, wanted):
    if not wanted:
        return captures
    chosen = []
    for item in wanted:
        if item.lstrip('-').isdigit():
            if not -len(captures) <= int(item) < len(captures):
                raise ArgumentCheckError(f'--layers {item}: the model has {len(captures)} linear attention '
                                         f'layers (indices 0..{len(captures) - 1})')
            chosen.append(captures[int(item)])
            continue
        matches = [c for c in captures if item in (c.name, short_layer_name(c.name))]
        if not matches:
            names = ', '.join(short_layer_name(c.name) for c in captures)
            raise ArgumentCheckError(f'--layers {item!r} is not a linear attention layer; choose from: {names}')
        chosen += matches
    return chosen


def entropy(p):
    p = p[p > 0]
    return float(-(p * p.log()).sum())


def main(argv=None):
    args = parse_args(argv)
    height, width = args.shape
    x, y = args.query if args.query is not None else (width // 2, height // 2)
    check_query((x, y), args.shape)
    model = load_model(args.config, args.checkpoint, args.cfg_options, args.device,
                       allow_partial=args.allow_partial, unsafe_load=args.unsafe_load)
    images, names = load_images([args.img] if args.img else [], (height, width), num_random=1)
    with AttentionRecorder(model) as recorder:
        run_model(model, images)
    captures = select_layers(recorder.captures, args.layers)
    if not captures:
        raise ValueError(f'{args.config} builds no PolaFormer++ linear attention layer')
    fewest_heads = min(c.num_heads for c in captures)
    if args.head is not None and args.head >= fewest_heads:
        raise ArgumentCheckError(f'--head must be < {fewest_heads} (the fewest heads of the chosen layers), '
                                 f'got {args.head}')
    rope = False if args.no_rope else None

    image_rgb = images[0].flip(0).permute(1, 2, 0).numpy()
    plt = agg_pyplot()
    cols = 1 + len(args.methods)
    fig, axes = plt.subplots(len(captures), cols, figsize=(2.4 * cols, 2.7 * len(captures) + 0.5),
                             squeeze=False)
    layers = track(captures, desc='attention maps per layer', enabled=progress_from_args(args))
    for r, capture in enumerate(layers):
        H, W = capture.grid
        query = (min(H - 1, y * H // height), min(W - 1, x * W // width))
        axes[r, 0].imshow(image_rgb)
        axes[r, 0].set_title(f'{short_layer_name(capture.name)}\n{H}x{W} tokens, query {query}', fontsize=7)
        for c, method in enumerate(args.methods, start=1):
            p = attention_map(capture, method, query, head=args.head, rope=rope)
            heat = F.interpolate(p[None, None].float(), size=(height, width), mode='nearest')[0, 0]
            ax = axes[r, c]
            ax.imshow(image_rgb)
            ax.imshow(heat.numpy(), cmap='jet', alpha=0.55)
            ax.set_title(f'{method}  H={entropy(p):.2f}', fontsize=7)
        for ax in axes[r]:
            ax.plot([x], [y], marker='x', color='white', markersize=7, markeredgewidth=2)
            ax.axis('off')
    head = 'mean over heads' if args.head is None else f'head {args.head}'
    fig.suptitle(f'{osp.basename(names[0])}: attention of pixel ({x}, {y}), {head}', fontsize=9)
    fig.tight_layout()
    os.makedirs(args.out_dir, exist_ok=True)
    png = osp.join(args.out_dir, 'attention_maps.png')
    fig.savefig(png, dpi=120)
    plt.close(fig)
    print(f'Saved {png}')
    return png


if __name__ == '__main__':
    torch.set_grad_enabled(False)
    exit_on_checkpoint_error(lambda argv: run_cli(main, argv))
