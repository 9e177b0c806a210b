"""Run a PolaFormer++ model on one image and write what it predicts, drawn.

The task follows from the config: its ``default_scope`` (``mmpretrain``:
classification, ``mmdet``: detection / instance segmentation, ``mmseg``:
semantic segmentation) or its model type (``SRRestorer``: super-resolution).
Classification, detection and segmentation go through the libraries' own
inferencers and visualizers; super-resolution through
:func:`polaformerpp.apis.restore_image`.

Examples::

    python demo/image_demo.py photo.jpg configs/classification/polapp-b0_8xb256_in1k.py \\
        --weights polapp-b0_in1k.pth
    python demo/image_demo.py photo.jpg configs/detection/mask-rcnn_polapp-b2_fpn_8xb2-amp-1x_coco.py \\
        --weights work_dirs/mask-rcnn_polapp-b2_fpn_8xb2-amp-1x_coco/epoch_12.pth --out-dir outputs
    python demo/image_demo.py photo.jpg configs/super_resolution/polapp-srlight_x2_8xb16-500k_div2k-192.py \\
        --weights iter_500000.pth --device cuda

What is written under ``--out-dir`` (default ``outputs``):

* classification: ``vis/<name>.png`` (mmpretrain's drawing of the top class),
  ``preds/<name>.json`` (the ``--topk`` classes and scores, also printed);
* detection: ``vis/<image file name>`` (boxes and masks above ``--score-thr``),
  ``preds/<name>.json`` (mmdet's prediction dict);
* segmentation: ``vis/<image file name>`` (the class map over the image),
  ``pred/<n>_pred.png`` (mmseg's label map);
* super-resolution: ``<name>_x<s>.png`` (the network's output, ``s`` times
  the input size) and ``<name>_x<s>_vs_bicubic.png`` (bicubic upscaling and
  the network side by side, twice as wide).

``--weights`` loads safely (``weights_only=True``; ``--unsafe-load`` to trust a
file that needs full unpickling) and strictly: a checkpoint that does not fit
the config (missing or unexpected keys, shape mismatches) is refused with the
listing, unless ``--allow-partial``.
"""
import argparse
import json
import os
import os.path as osp
import sys
import time

PROG = 'image_demo.py'
TASKS = ('classification', 'detection', 'segmentation', 'super_resolution')
SCOPE_TO_TASK = {'mmpretrain': 'classification', 'mmdet': 'detection', 'mmseg': 'segmentation'}
SR_MODEL_TYPES = ('SRRestorer', )


class DemoArgumentError(ValueError):
    """A command-line argument the demo cannot use (the message names it)."""


def parse_args(argv=None):
    from mmengine.config import DictAction

    from polaformerpp.utils.checkpoint import ALLOW_PARTIAL_HELP, UNSAFE_LOAD_HELP

    parser = argparse.ArgumentParser(
        prog=PROG, description='Run a classification, detection, segmentation or super-resolution config on one image')
    parser.add_argument('image', help='image file (anything OpenCV reads: PNG, JPEG, ...)')
    parser.add_argument('config', help='config file of one of the four tasks')
    parser.add_argument('--weights', help='checkpoint file (omitted: the randomly initialised model)')
    parser.add_argument('--allow-partial', action='store_true', help=ALLOW_PARTIAL_HELP)
    parser.add_argument('--unsafe-load', action='store_true', help=UNSAFE_LOAD_HELP)
    parser.add_argument('--out-dir', default='outputs', help='folder for the drawn image(s) and predictions')
    parser.add_argument('--device', default=None,
                        help="torch device, e.g. 'cpu', 'cuda:0' (default: cuda:0 if available, else cpu)")
    parser.add_argument('--topk', type=int, default=5, help='classification: how many classes to report')
    parser.add_argument('--score-thr', type=float, default=0.3,
                        help='detection: draw instances with at least this score')
    parser.add_argument('--opacity', type=float, default=0.5, help='segmentation: opacity of the class map')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
        help='override config entries, e.g. test_dataloader.dataset.pipeline.1.scale="(640,480)"')
    args = parser.parse_args(argv)
    check_args(parser, args)
    return args


def check_args(parser, args):
    """Fail early, naming the argument, on files that are missing and on bad numbers."""
    if not osp.isfile(args.image):
        parser.error(f'argument image: no such file: {args.image}')
    if not osp.isfile(args.config):
        parser.error(f'argument config: no such file: {args.config}')
    if args.weights is not None and not osp.isfile(args.weights):
        parser.error(f'argument --weights: checkpoint not found: {args.weights}')
    if args.topk < 1:
        parser.error(f'argument --topk: expected a positive int, got {args.topk}')
    if not 0.0 <= args.opacity <= 1.0:
        parser.error(f'argument --opacity: expected a value in [0, 1], got {args.opacity}')


def task_of(cfg, config_path):
    """The task of a loaded config: one of :data:`TASKS`; :class:`DemoArgumentError` for anything else."""
    model_type = cfg.get('model', {}).get('type')
    if model_type in SR_MODEL_TYPES:
        return 'super_resolution'
    scope = cfg.get('default_scope')
    if scope in SCOPE_TO_TASK:
        return SCOPE_TO_TASK[scope]
    hint = ' (generation configs: use tools/generation/sample.py)' if scope == 'mmengine' else ''
    raise DemoArgumentError(f'argument config: {config_path} has default_scope={scope!r} and model type '
                     f'{model_type!r}; this demo runs classification (default_scope mmpretrain), detection '
                     f'(mmdet), segmentation (mmseg) and super-resolution (model type SRRestorer) '
                     f'configs{hint}')


def read_image(path):
    """The image at ``path`` as an HxWx3 uint8 BGR array; :class:`DemoArgumentError` if undecodable."""
    import mmcv
    img = mmcv.imread(path, flag='color')
    if img is None:
        raise DemoArgumentError(f'argument image: {path} is not an image OpenCV can read')
    return img


def default_device():
    import torch
    return 'cuda:0' if torch.cuda.is_available() else 'cpu'


def files_under(folder):
    """``{path: mtime}`` of the files under ``folder`` (to report what a library wrote)."""
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = osp.join(root, name)
            found[path] = os.stat(path).st_mtime_ns
    return found


def stem(path):
    return osp.splitext(osp.basename(path))[0]


def write_json(path, obj):
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        json.dump(obj, f, indent=2)
    return path


# ----------------------------------------------------------------------------------- the tasks


def run_classification(args, cfg):
    """mmpretrain's ``ImageClassificationInferencer``; prints and writes the top-k classes."""
    from mmpretrain.apis import ImageClassificationInferencer

    inferencer = ImageClassificationInferencer(model=cfg, pretrained=args.weights or False, device=args.device)
    vis_dir = osp.join(args.out_dir, 'vis')
    os.makedirs(vis_dir, exist_ok=True)
    result = inferencer(args.image, show_dir=vis_dir)[0]
    scores = result['pred_scores']
    k = min(args.topk, len(scores))
    order = scores.argsort()[::-1][:k]
    classes = inferencer.classes
    topk = [dict(label=int(i), score=float(scores[i]), **({'class': classes[i]} if classes else {}))
            for i in order]
    for rank, item in enumerate(topk, 1):
        name = f" {item['class']}" if 'class' in item else ''
        print(f"top-{rank}: {item['label']}{name} ({item['score']:.4f})")
    pred_path = write_json(osp.join(args.out_dir, 'preds', stem(args.image) + '.json'),
                           dict(image=args.image, topk=topk))
    return [osp.join(vis_dir, stem(args.image) + '.png'), pred_path]


def run_detection(args, cfg):
    """mmdet's ``DetInferencer``: the drawing under ``vis/``, mmdet's prediction dict under ``preds/``."""
    from mmdet.apis import DetInferencer

    inferencer = DetInferencer(model=cfg, weights=args.weights, device=args.device, show_progress=False)
    result = inferencer(args.image, out_dir=args.out_dir, pred_score_thr=args.score_thr, no_save_pred=False)
    pred = result['predictions'][0]
    kept = sum(score >= args.score_thr for score in pred.get('scores', []))
    print(f'{len(pred.get("scores", []))} instances predicted, {kept} with score >= {args.score_thr}')
    return None  # the files are found by listing the output folder


def use_config_classes(model, cfg):
    """Name the segmentor's classes after the config's test dataset when the checkpoint did not.

    Without class names in the checkpoint (or without a checkpoint) mmseg's
    inferencer falls back to Cityscapes' 19 classes; when their number differs
    from the decode head's, the test dataset's classes and palette are used.
    """
    from mmseg.registry import DATASETS
    num_classes = cfg.model.get('decode_head', {}).get('num_classes')
    meta = getattr(model, 'dataset_meta', None) or {}
    if num_classes is None or len(meta.get('classes') or ()) == num_classes:
        return
    dataset_type = cfg.get('test_dataloader', {}).get('dataset', {}).get('type')
    dataset_cls = DATASETS.get(dataset_type) if isinstance(dataset_type, str) else None
    metainfo = getattr(dataset_cls, 'METAINFO', {})
    if len(metainfo.get('classes', ())) == num_classes and 'palette' in metainfo:
        model.dataset_meta = dict(classes=metainfo['classes'], palette=metainfo['palette'])


def run_segmentation(args, cfg):
    """mmseg's ``MMSegInferencer``: the class map drawn over the image under ``vis/``."""
    from mmseg.apis import MMSegInferencer

    inferencer = MMSegInferencer(model=cfg, weights=args.weights, device=args.device)
    use_config_classes(inferencer.model, cfg)
    result = inferencer(args.image, out_dir=args.out_dir, opacity=args.opacity)
    seg = result['predictions'] if isinstance(result, dict) else None
    if seg is not None and hasattr(seg, 'shape'):
        import numpy as np
        labels, counts = np.unique(seg, return_counts=True)
        top = sorted(zip(counts.tolist(), labels.tolist()), reverse=True)[:5]
        names = (getattr(inferencer.model, 'dataset_meta', None) or {}).get('classes') or ()
        print('most frequent classes (label name: pixels): ' + ', '.join(
            f'{label} {names[label] if label < len(names) else ""}: {count}' for count, label in top))
    return None


def side_by_side(bicubic, restored, labels=('bicubic', 'PolaFormer++')):
    """``[bicubic | restored]``, both ``(H, W, 3)`` uint8, with a caption in each top-left corner."""
    import cv2
    import numpy as np
    if bicubic.shape != restored.shape:
        raise ValueError(f'side_by_side needs two images of one shape, got {bicubic.shape} and {restored.shape}')
    panels = []
    for img, text in zip((bicubic, restored), labels):
        img = img.copy()
        scale = max(img.shape[0] / 400.0, 0.3)
        width = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)[0][0]
        scale = max(min(scale, scale * 0.9 * img.shape[1] / width), 0.3)  # fit the panel's width
        thickness = max(1, int(round(scale * 2)))
        (w, h), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, thickness)
        pad = max(2, h // 3)
        cv2.rectangle(img, (0, 0), (w + 2 * pad, h + base + 2 * pad), (0, 0, 0), thickness=-1)
        cv2.putText(img, text, (pad, pad + h), cv2.FONT_HERSHEY_SIMPLEX, scale, (255, 255, 255), thickness,
                    cv2.LINE_AA)
        panels.append(img)
    return np.concatenate(panels, axis=1)


def run_super_resolution(args, cfg):
    """``polaformerpp.apis.restore_image``; writes the SR image and a side-by-side with bicubic."""
    import cv2

    from polaformerpp.apis import restore_image
    from polaformerpp.apis.config_loading import build_from_config, load_config
    from polaformerpp.restoration import SRRestorer

    lr = read_image(args.image)
    # what init_restorer does, with the demo's --allow-partial / --unsafe-load
    model = build_from_config(load_config(args.config, args.cfg_options), SRRestorer, args.weights, args.device,
                              'image_demo.py', allow_partial=args.allow_partial, unsafe_load=args.unsafe_load)
    sr = restore_image(model, lr)
    h, w = lr.shape[:2]
    scale = sr.shape[0] // h
    if scale < 1 or sr.shape[:2] != (h * scale, w * scale):
        raise RuntimeError(f'restore_image returned {sr.shape} for a {h}x{w} input: expected an integer '
                           f'multiple of the input size')
    bicubic = cv2.resize(lr, (w * scale, h * scale), interpolation=cv2.INTER_CUBIC)
    os.makedirs(args.out_dir, exist_ok=True)
    base = osp.join(args.out_dir, f'{stem(args.image)}_x{scale}')
    sr_path, pair_path = base + '.png', base + '_vs_bicubic.png'
    labels = (f'bicubic x{scale}', f'PolaFormer++ x{scale}' + ('' if args.weights else ' (random init)'))
    for path, img in ((sr_path, sr), (pair_path, side_by_side(bicubic, sr, labels))):
        if not cv2.imwrite(path, img):
            raise OSError(f'could not write {path}')
    print(f'x{scale}: {w}x{h} -> {w * scale}x{h * scale}')
    return [sr_path, pair_path]


RUNNERS = {
    'classification': run_classification,
    'detection': run_detection,
    'segmentation': run_segmentation,
    'super_resolution': run_super_resolution,
}


def check_weights(args, cfg):
    """Refuse ``--weights`` that do not fit the config before the library's inferencer loads them leniently.

    The model is built and the checkpoint loaded into it once, safely and
    strictly (:func:`polaformerpp.analysis.load_model`); the inferencer then
    builds its own.
    """
    from polaformerpp.analysis import load_model
    load_model(cfg.copy(), args.weights, allow_partial=args.allow_partial, unsafe_load=args.unsafe_load)


def load_config(args):
    """The config with ``--cfg-options`` merged and, without CUDA, SyncBN as BN."""
    from mmengine.config import Config

    from polaformerpp.utils import adapt_cfg_to_device
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    cfg.pop('optim_wrapper', None)  # training only (and its AMP setting would be reported on CPU)
    if not str(args.device).startswith('cuda'):
        adapt_cfg_to_device(cfg)
    return cfg


def main(argv=None):
    args = parse_args(argv)
    if args.device is None:
        args.device = default_device()
    try:
        read_image(args.image)
        cfg = load_config(args)
        task = task_of(cfg, args.config)
    except DemoArgumentError as err:
        print(f'{PROG}: error: {err}', file=sys.stderr)
        sys.exit(2)
    from polaformerpp.utils import set_unsafe_loading
    set_unsafe_loading(args.unsafe_load)
    if args.weights is not None and task != 'super_resolution':
        check_weights(args, cfg)
    print(f'task: {task}; config: {args.config}; weights: {args.weights or "none (random initialisation)"}')
    os.makedirs(args.out_dir, exist_ok=True)
    before = files_under(args.out_dir)
    start = time.time()
    written = RUNNERS[task](args, cfg)
    if written is None:
        after = files_under(args.out_dir)
        written = sorted(p for p, mtime in after.items() if before.get(p) != mtime)
    print(f'done in {time.time() - start:.1f} s; written:')
    for path in written:
        print(f'  {path}')
    return written


if __name__ == '__main__':
    from polaformerpp.utils.checkpoint import exit_on_checkpoint_error
    exit_on_checkpoint_error(main)
