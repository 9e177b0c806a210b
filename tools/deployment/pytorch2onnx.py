"""Export the network of a config to ONNX, and check the file with onnxruntime.

What is exported, by config:

* a classifier (mmpretrain): image -> ``logits`` ``(B, num_classes)``;
* a detection or segmentation config (mmdet, mmseg): its backbone
  (``cfg.model.backbone``), image -> the feature maps of its ``out_indices``,
  named by stride (``stride4``, ``stride8``, ``stride16``, ``stride32``;
  ``cls_proj`` for index 4); the neck and heads stay in PyTorch;
* a super-resolution config: the network, normalised LR ``(B, 3, h, w)``
  (``x / 255 - mean``, see :class:`~polaformerpp.restoration.SRDataPreprocessor`)
  -> ``sr`` ``(B, 3, s h, s w)`` in the same normalisation.

Inputs are ``(1, 3, H, W)`` float32, already normalised (the data pipeline
and preprocessor are not exported). CHECKPOINT loads safely and strictly
(:mod:`polaformerpp.utils.checkpoint`): a classifier's or SR model's whole
state dict, a detector's / segmentor's ``backbone.*`` tensors; one that does
not fit is refused with the keys (``--allow-partial`` to go on).

The graph is captured with ``torch.export`` (non-strict) and translated by
``torch.onnx``'s dynamo exporter (onnxscript). The TorchScript exporter
(``dynamo=False``) is not used: its graph of the attention does not load in
onnxruntime (a ``Concat`` fails shape inference). The exported program holds
the attention's fused CPU kernel as a custom op; it is decomposed into the
op's eager torch form (the kernel is not an ONNX operator; the maths is the
same) in the exporter's own re-trace of the program. ``--dynamic`` makes H
and W symbolic (``height``, ``width``; ``H, W >= 64`` for classifiers and
backbones, so that the stride-32 stage keeps 2x2 tokens, ``>= 17`` for SR,
two windows): the export then checks the traced graph's shape guards at
several sizes (from the smallest to 16x the export size) and refuses a graph
that a size-dependent branch or loop fixed to the export size. ``--opset`` targets
another ai.onnx opset than the exporter's own (18) through the onnxscript
version converter.

``--verify`` runs the file with onnxruntime (CPU) at two input sizes (the
export size and, with ``--dynamic``, a larger one of another aspect; without,
two random inputs of the export size) and prints, per output, the max
relative error ``max|onnx - torch| / max|torch|`` against the PyTorch
model; above ``--tolerance`` (1e-4) the tool exits with code 1.

Examples::

    python tools/deployment/pytorch2onnx.py configs/classification/polapp-b0_8xb256_in1k.py \\
        polapp-b0_in1k.pth --out b0.onnx --dynamic --verify
    python tools/deployment/pytorch2onnx.py configs/detection/mask-rcnn_polapp-b2_fpn_8xb2-amp-1x_coco.py \\
        mask-rcnn_b2.pth --out b2_backbone.onnx --shape 512 768 --dynamic --verify
    python tools/deployment/pytorch2onnx.py configs/super_resolution/polapp-srlight_x2_8xb16-500k_div2k-192.py \\
        --out srlight_x2.onnx --shape 64 --dynamic --verify
"""
import argparse
import contextlib
import os
import os.path as osp
import re
import sys
import time
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.config import Config, DictAction

from polaformerpp.ops.pola_attention import eager_decompositions
from polaformerpp.utils.checkpoint import ALLOW_PARTIAL_HELP, UNSAFE_LOAD_HELP, exit_on_checkpoint_error
from polaformerpp.utils.cli import ArgumentCheckError, image_shape, parser_errors, positive_float, run_cli

#: the ai.onnx opset the exporter's translation table is written for; others go through a converter
EXPORTER_OPSET = 18
MIN_OPSET = 18
DEFAULT_SHAPES = dict(classifier=(224, 224), backbone=(512, 512), sr=(64, 64))
#: smallest H, W of a dynamic export: every stage of a backbone keeps >= 2 tokens per side, the SR
#: network >= 2 windows (16 px) per side; the tracer specialises symbolic sizes of 1
MIN_DYNAMIC_SIZE = dict(classifier=64, backbone=64, sr=17)
OUTPUT_NAMES = {0: 'stride4', 1: 'stride8', 2: 'stride16', 3: 'stride32', 4: 'cls_proj'}
DEFAULT_TOLERANCE = 1e-4


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Export the network of a config to ONNX')
    parser.add_argument('config', help='config file path')
    parser.add_argument('checkpoint', nargs='?', default=None,
                        help='checkpoint to export (default: the initial weights)')
    parser.add_argument('--out', required=True, help='the ONNX file to write')
    parser.add_argument('--shape', type=int, nargs='+', default=None,
                        help='input H W (or one size) of the export; default 224 for classifiers, 512 for '
                             'backbones, 64 (the LR size) for super-resolution')
    parser.add_argument('--dynamic', action='store_true', help='make the input height and width dynamic axes')
    parser.add_argument('--opset', type=int, default=EXPORTER_OPSET,
                        help=f'ai.onnx opset to target (>= {MIN_OPSET}; default {EXPORTER_OPSET}, the '
                             "exporter's own)")
    parser.add_argument('--verify', action='store_true',
                        help='run the file with onnxruntime at two input sizes and compare with PyTorch')
    parser.add_argument('--tolerance', type=positive_float, default=DEFAULT_TOLERANCE,
                        help='--verify fails above this max relative error (default 1e-4)')
    parser.add_argument('--allow-partial', action='store_true', help=ALLOW_PARTIAL_HELP)
    parser.add_argument('--unsafe-load', action='store_true', help=UNSAFE_LOAD_HELP)
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config entries')
    args = parser.parse_args(argv)
    with parser_errors(parser):
        args.shape = image_shape(args.shape)
        if not osp.isfile(args.config):
            raise ArgumentCheckError(f'config: {args.config} not found')
        if args.checkpoint is not None and not osp.isfile(args.checkpoint):
            raise ArgumentCheckError(f'checkpoint: {args.checkpoint} not found')
        if args.opset < MIN_OPSET:
            raise ArgumentCheckError(f'--opset must be >= {MIN_OPSET} (the dynamo exporter), got {args.opset}')
        out_dir = osp.dirname(osp.abspath(args.out))
        if not osp.isdir(out_dir):
            raise ArgumentCheckError(f'--out: folder {out_dir} does not exist')
    return args


# --------------------------------------------------------------------------- what is exported
class ClassifierLogits(nn.Module):
    """An mmpretrain classifier as ``image (B, 3, H, W) -> logits (B, num_classes)``."""

    def __init__(self, classifier: nn.Module):
        super().__init__()
        self.classifier = classifier

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.classifier(inputs, mode='tensor')


class SRNetwork(nn.Module):
    """The network of an :class:`~polaformerpp.restoration.SRRestorer`: normalised LR -> normalised SR.

    The network alone (it pads to its window internally, so any size runs): the
    restorer's test-time mirror padding to the window (``pad_to_window``) and
    tiling (``tile``) stay outside the graph, in the caller's hands.
    """

    def __init__(self, restorer: nn.Module):
        super().__init__()
        self.restorer = restorer

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.restorer.network(inputs)


class Exportable(NamedTuple):
    """A network ready for export: the module (eval, CPU), its kind, its output names, its input channels."""
    module: nn.Module
    kind: str
    output_names: List[str]
    in_channels: int


def _load_config(config: str, cfg_options: Optional[dict]) -> Config:
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    return cfg


def config_kind(cfg: Config) -> str:
    """``'classifier'``, ``'backbone'`` (detection / segmentation) or ``'sr'``; else a clear error."""
    scope = cfg.get('default_scope', None)
    model = cfg.get('model', {})
    if scope == 'mmpretrain':
        return 'classifier'
    if scope in ('mmdet', 'mmseg'):
        if 'backbone' not in model:
            raise ArgumentCheckError(f'config: an {scope} config without model.backbone; nothing to export')
        return 'backbone'
    if 'upscale' in model.get('network', {}):
        return 'sr'
    raise ArgumentCheckError(
        f"config: pytorch2onnx exports classifiers (mmpretrain), the backbone of detection / segmentation "
        f"configs (mmdet, mmseg) and super-resolution networks; this config builds {model.get('type')!r} "
        f'(default_scope {scope!r})')


def _build_backbone(cfg: Config, checkpoint: Optional[str], allow_partial: bool, unsafe_load: bool) -> nn.Module:
    """``cfg.model.backbone`` through the registry, with the ``backbone.*`` tensors of a checkpoint loaded strictly."""
    from mmengine.registry import MODELS, init_default_scope
    from mmengine.utils import import_modules_from_strings

    from polaformerpp.utils.checkpoint import load_model_weights

    init_default_scope(cfg.default_scope)
    if 'custom_imports' in cfg:
        import_modules_from_strings(**cfg.custom_imports)
    backbone_cfg = cfg.model.backbone.copy()
    backbone_cfg['init_cfg'] = None  # the weights come from the checkpoint, or stay initial
    backbone = MODELS.build(backbone_cfg)
    if checkpoint is not None:
        load_model_weights(backbone, checkpoint, allow_partial=allow_partial, unsafe=True if unsafe_load else None,
                           prefix='backbone.')
    return backbone


def build_exportable(config: str, checkpoint: Optional[str] = None, cfg_options: Optional[dict] = None,
                     allow_partial: bool = False, unsafe_load: bool = False) -> Exportable:
    """The network of ``config`` to export, with ``checkpoint`` loaded safely and strictly.

    Raises:
        ArgumentCheckError: a config of another kind.
        CheckpointMismatchError: the checkpoint does not fit the network (unless ``allow_partial``).
    """
    from polaformerpp.analysis import load_model

    cfg = _load_config(config, cfg_options)
    kind = config_kind(cfg)
    if kind == 'backbone':
        module = _build_backbone(cfg, checkpoint, allow_partial, unsafe_load)
        indices = list(getattr(module, 'out_indices', range(4)))
        names = [OUTPUT_NAMES.get(i, f'out{i}') for i in indices]
        in_channels = getattr(module, 'in_channels', 3)
    else:
        model = load_model(cfg, checkpoint, allow_partial=allow_partial, unsafe_load=unsafe_load)
        if kind == 'classifier':
            module, names = ClassifierLogits(model), ['logits']
            in_channels = getattr(model.backbone, 'in_channels', 3)
        else:
            module, names = SRNetwork(model), ['sr']
            in_channels = model.network.in_channels
    return Exportable(module.cpu().eval(), kind, names, in_channels)


# --------------------------------------------------------------------------- export
def _example_input(in_channels: int, shape: Tuple[int, int], seed: int = 0) -> torch.Tensor:
    return torch.randn(1, in_channels, *shape, generator=torch.Generator().manual_seed(seed))


def probe_sizes(shape: Tuple[int, int], min_size: int) -> List[Tuple[int, int]]:
    """Input sizes at which a dynamic graph's guards are checked: the smallest allowed, odd, large, very large."""
    height, width = shape
    return [(min_size, min_size), (min_size, 8 * width + 5), (height + 37, width + 71), (2 * height + 1, 3 * width + 3),
            (4 * height, 4 * width), (16 * height + 7, 16 * width)]


def capture_program(module: nn.Module, example: torch.Tensor, dynamic: bool, min_size: int):
    """``torch.export`` (non-strict) of ``module`` at ``example``; H and W symbolic with ``dynamic``.

    The program keeps the kernels' custom ops (:func:`exporter_decomposes` turns them into torch
    ops when ``torch.onnx`` translates it).

    H and W are marked ``Dim.DYNAMIC(min=min_size)``: guards the tracer cannot prove
    (``H <= 16 * ceil(H / 16)``) are kept as guards instead of failing the export. The
    guards are then checked at :func:`probe_sizes`: one that fails there (a size or a
    Python loop count fixed by the traced example) means the graph, which ONNX runs
    without them, would be wrong at that size.

    Raises:
        RuntimeError: a guard of the traced graph fails at a probed size (the guard and
            the size are named).
    """
    dynamic_shapes = None
    if dynamic:
        height, width = example.shape[-2:]
        if min(height, width) < min_size:
            raise ArgumentCheckError(f'--shape: a dynamic export needs H, W >= {min_size} for this network, '
                                     f'got {height}x{width}')
        dims = {2: torch.export.Dim.DYNAMIC(min=min_size), 3: torch.export.Dim.DYNAMIC(min=min_size)}
        dynamic_shapes = (dims, )
    with torch.no_grad():
        program = torch.export.export(module, (example, ), dynamic_shapes=dynamic_shapes, strict=False)
    if dynamic:
        check_guards(program, example, probe_sizes(tuple(example.shape[-2:]), min_size))
    return program


def check_guards(program, example: torch.Tensor, sizes: Sequence[Tuple[int, int]]) -> None:
    """Raise unless the exported program's shape guards hold at every size in ``sizes``."""
    guards = getattr(program.module(), '_guards_fn', None)
    if guards is None:  # a torch without guard functions: --verify at two sizes is the check
        return
    failures = []
    for size in sizes:
        try:
            guards(torch.empty(*example.shape[:2], *size, device='meta'))
        except AssertionError as error:
            failures.append(f'  {size[0]}x{size[1]}: {str(error).splitlines()[0]}')
    if failures:
        raise RuntimeError(
            f'--dynamic: the traced graph is valid only at some input sizes (a size-dependent branch, check or '
            f'Python loop fixed them at the export size {example.shape[-2]}x{example.shape[-1]}); its guards fail '
            'at:\n' + '\n'.join(failures) + '\nExport without --dynamic (a graph for one size), or remove the '
            'size dependence.')


@contextlib.contextmanager
def exporter_decomposes(decompositions: Dict[object, Callable]) -> Iterator[None]:
    """Within: ``torch.onnx``'s exporter decomposes the ops of ``decompositions`` as given.

    The exporter re-traces the program once with its decomposition table, which it builds from
    ``torch._decomp.decomposition_table``; the entries are set there for the block and the table is
    restored after. Decomposing them in a re-trace of their own first costs a second trace of the
    whole program (about a fifth of a small network's export).
    """
    import torch._decomp
    table = torch._decomp.decomposition_table
    previous = {op: table[op] for op in decompositions if op in table}
    table.update(decompositions)
    try:
        yield
    finally:
        for op in decompositions:
            del table[op]
        table.update(previous)


def name_dynamic_axes(model) -> None:
    """Rename the tracer's symbols of the input's H and W (``s34``...) to ``height`` / ``width``, everywhere.

    Output axes become expressions of those names (``2*height``, ``((height - 1)//4) + 1``).
    """
    dims = model.graph.input[0].type.tensor_type.shape.dim
    names = {dims[axis].dim_param: name for axis, name in ((2, 'height'), (3, 'width')) if dims[axis].dim_param}
    if not names:
        return
    pattern = re.compile(r'\b(' + '|'.join(map(re.escape, names)) + r')\b')
    for value in (*model.graph.input, *model.graph.output, *model.graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param:
                dim.dim_param = pattern.sub(lambda match: names[match.group(1)], dim.dim_param)


def export_onnx(exportable: Exportable, out: str, shape: Tuple[int, int], dynamic: bool = False,
                opset: int = EXPORTER_OPSET) -> dict:
    """Write ``exportable`` to ``out`` (ONNX, weights inside); returns what was written.

    The returned dict holds the file, the opset, the input / output names with
    their ONNX shapes (dynamic axes by name) and the export time.
    """
    import onnx

    start = time.perf_counter()
    example = _example_input(exportable.in_channels, shape)
    program = capture_program(exportable.module, example, dynamic, MIN_DYNAMIC_SIZE[exportable.kind])
    with exporter_decomposes(eager_decompositions()):  # the kernels' custom ops -> torch ops
        onnx_program = torch.onnx.export(program, (example, ), input_names=['input'],
                                         output_names=exportable.output_names, opset_version=opset, dynamo=True,
                                         verbose=False)
    onnx_program.save(out)
    model = onnx.load(out)
    if dynamic:
        name_dynamic_axes(model)
        onnx.save(model, out)
    onnx.checker.check_model(model)

    def dims(value):
        return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]

    opsets = {entry.domain or 'ai.onnx': entry.version for entry in model.opset_import}
    return dict(file=out, kind=exportable.kind, opset=opsets.get('ai.onnx'), dynamic=dynamic,
                inputs={v.name: dims(v) for v in model.graph.input},
                outputs={v.name: dims(v) for v in model.graph.output},
                export_s=time.perf_counter() - start, size_mib=os.path.getsize(out) / 2**20)


# --------------------------------------------------------------------------- verification
def verification_shapes(shape: Tuple[int, int], dynamic: bool) -> List[Tuple[int, int]]:
    """The two input sizes of ``--verify``: the export size and, when dynamic, a larger one of another
    aspect ratio, both sides odd (the backbones' strides and the SR windows then pad)."""
    height, width = shape
    return [shape, (height + 37, width + 71) if dynamic else shape]


def verify_onnx(exportable: Exportable, onnx_file: str, shapes: Sequence[Tuple[int, int]]) -> List[dict]:
    """Run ``onnx_file`` with onnxruntime (CPU) and the PyTorch module on one random input per shape.

    Returns:
        list[dict]: per input and output ``shape``, ``output``, ``max_abs_error``,
        ``max_abs_reference`` and ``relative_error = max_abs_error / max_abs_reference``.
    """
    import onnxruntime

    session = onnxruntime.InferenceSession(onnx_file, providers=['CPUExecutionProvider'])
    rows = []
    for seed, shape in enumerate(shapes):
        x = _example_input(exportable.in_channels, shape, seed=seed + 1)
        with torch.no_grad():
            reference = exportable.module(x)
        if isinstance(reference, torch.Tensor):
            reference = (reference, )
        outputs = session.run(exportable.output_names, {'input': x.numpy()})
        for name, ref, got in zip(exportable.output_names, reference, outputs):
            ref = ref.float()
            got = torch.from_numpy(got)
            if got.shape != ref.shape:
                raise RuntimeError(f'--verify: onnxruntime output {name} has shape {tuple(got.shape)}, PyTorch '
                                   f'{tuple(ref.shape)} (input {shape[0]}x{shape[1]})')
            error = (got - ref).abs().max().item()
            scale = ref.abs().max().item()
            rows.append(dict(shape=tuple(shape), output=name, output_shape=tuple(ref.shape), max_abs_error=error,
                             max_abs_reference=scale, relative_error=error / scale if scale > 0 else error))
    return rows


def format_verification(rows: Sequence[dict]) -> str:
    lines = ['input     output     shape                  max|onnx-torch|  max|torch|  relative']
    for row in rows:
        size = f'{row["shape"][0]}x{row["shape"][1]}'
        lines.append(f'{size:<9} {row["output"]:<10} {str(row["output_shape"]):<22} '
                     f'{row["max_abs_error"]:<16.3e} {row["max_abs_reference"]:<11.4g} {row["relative_error"]:.3e}')
    return '\n'.join(lines)


def main(argv=None):
    args = parse_args(argv)
    exportable = build_exportable(args.config, args.checkpoint, args.cfg_options, args.allow_partial,
                                  args.unsafe_load)
    shape = args.shape or DEFAULT_SHAPES[exportable.kind]
    result = export_onnx(exportable, args.out, shape, args.dynamic, args.opset)
    print(f"{osp.basename(args.config)}: exported the {exportable.kind} to {args.out} "
          f"({result['size_mib']:.1f} MiB, ai.onnx opset {result['opset']}, {result['export_s']:.0f} s)")
    for role in ('inputs', 'outputs'):
        print(f'{role}: ' + ', '.join(f'{name} {dims}' for name, dims in result[role].items()))
    if args.verify:
        rows = verify_onnx(exportable, args.out, verification_shapes(shape, args.dynamic))
        print(f'onnxruntime {__import__("onnxruntime").__version__} vs PyTorch {torch.__version__}:')
        print(format_verification(rows))
        worst = max(row['relative_error'] for row in rows)
        result['verification'] = rows
        result['max_relative_error'] = worst
        if not worst <= args.tolerance:
            sys.stderr.write(f'pytorch2onnx.py: error: --verify: max relative error {worst:.3e} is above '
                             f'--tolerance {args.tolerance:g}\n')
            raise SystemExit(1)
        print(f'verified: max relative error {worst:.3e} <= {args.tolerance:g}')
    return result


if __name__ == '__main__':
    exit_on_checkpoint_error(lambda argv: run_cli(main, argv))
