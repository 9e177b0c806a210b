"""torch.compile (CPU) of every task's network, in training and in evaluation.

Each test builds a small version of a shipped config, trains it for two SGD
steps eagerly and compiled from the same weights (loss, backward, step), then
evaluates both: losses, gradients and outputs agree to 1e-4 relative.

Two backends: ``aot_eager`` (TorchDynamo's graph capture and AOTAutograd's
joint forward/backward graph, run by eager kernels: what breaks when model
code cannot be traced) for every task; ``inductor`` (the default, what
``torch.compile(model)`` gives: generated C++ kernels) for the classifier,
i.e. the backbone with both attention types. Compiling is slow on a small
CPU (4-20 s per aot_eager test, a minute or more for inductor even on the
two-block network of :data:`COMPILE_ARCH`), so only the classifier, the SR
network, the Mask R-CNN backbone + neck and DiT run by default; the rest
are ``slow``. The inductor check runs in a new interpreter of its own
(``in_new_interpreter``): the generated libraries are loaded there, not in
the test worker, and a crash in them fails that test with its signal and
stack rather than ending the worker.
"""
import contextlib
import copy

import pytest
import torch
import torch.nn as nn

from conftest import TWO_BLOCK_ARCH, in_new_interpreter, load_tool
from detection_testing import MASK_RCNN_B2, RETINANET_B2, build_detector, demo_batch, load_cfg
from segmentation_testing import build_segmentor, seg_batch

CLASSIFIER = 'configs/classification/polapp-b0_8xb256_in1k.py'
LIGHTHAM = 'configs/segmentation/polapp-b1_lightham_8xb8-160k_ade20k-512x512.py'
SR_X2 = 'configs/super_resolution/polapp-srlight_x2_8xb16-500k_div2k-192.py'
DIT = 'configs/generation/dit-tiny-4_polapp_1xb32-2k_demo-shapes-32.py'
TOLERANCE = 1e-4
#: one input size for the backbone tests: their kernels are then compiled once and shared
IMAGES = (2, 3, 64, 64)
#: the smallest backbone with every kind of layer: stem, a linear-attention block (stage 2), a
#: softmax block (stage 3), two heads each, the three downsamplings and the output norms. Stages 1
#: and 4 have no blocks: compiling costs per distinct kernel (inductor builds one C++ library for
#: each), and a block in each of them too would take the classifier's builds from 64 to 99 and
#: exercise no other code.
COMPILE_ARCH = TWO_BLOCK_ARCH


@contextlib.contextmanager
def one_thread_fresh_compiler():
    """One intra-op thread (tiny models on a shared CPU), inductor's C++ builds one at a time in
    this process (a pool of compile processes would only compete with the other test workers),
    and no compiled code left from other tests."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch._dynamo.reset()
    with torch._inductor.config.patch(compile_threads=1):
        yield
    torch._dynamo.reset()
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def compiler_settings():
    """Every test here runs under :func:`one_thread_fresh_compiler`."""
    with one_thread_fresh_compiler():
        yield


def relative_error(got, expected) -> float:
    """``max|got - expected| / max|expected|`` over tensors (or nested tuples / lists / dicts of them)."""
    got, expected = _flatten(got), _flatten(expected)
    assert len(got) == len(expected)
    error = max((g.detach().float() - e.detach().float()).abs().max().item() for g, e in zip(got, expected))
    scale = max(e.detach().float().abs().max().item() for e in expected)
    return error / scale


def _flatten(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [t for item in value for t in _flatten(item)]


def gradients(model: nn.Module):
    return [p.grad for p in model.parameters() if p.grad is not None]


AOT_EAGER = 'aot_eager'
FAST = pytest.param(AOT_EAGER, id=AOT_EAGER)
INDUCTOR = pytest.param('inductor', id='inductor', marks=pytest.mark.slow)


def check_compiled_training_and_evaluation(model: nn.Module, loss_fn, output_fn, backend: str, lr: float = 1e-2):
    """Train ``model`` and a copy compiled by ``backend`` for two SGD steps, evaluate both; compare all of it.

    ``loss_fn(module) -> scalar``; ``output_fn(module) -> tensor(s)`` (called in eval mode, no grad).
    Both run with the same random seed and inductor draws random numbers as eager does
    (``fallback_random``), so dropout, random initialisations and sampling inside match.
    """
    with torch._inductor.config.patch(fallback_random=True):
        _check_compiled_training_and_evaluation(model, loss_fn, output_fn, backend, lr)


def _check_compiled_training_and_evaluation(model, loss_fn, output_fn, backend, lr):
    eager = model.train()
    compiled_copy = copy.deepcopy(model)
    compiled = torch.compile(compiled_copy, backend=backend)
    optimizers = [torch.optim.SGD(m.parameters(), lr=lr) for m in (eager, compiled_copy)]
    for step in range(2):
        losses = []
        for module, optimizer in zip((eager, compiled), optimizers):
            optimizer.zero_grad()
            torch.manual_seed(step)
            loss = loss_fn(module)
            loss.backward()
            losses.append(loss.detach())
        assert torch.isfinite(losses[1]), f'step {step}: compiled loss {losses[1]}'
        assert relative_error(losses[1], losses[0]) < TOLERANCE, f'step {step}: losses {losses}'
        grads = [gradients(eager), gradients(compiled_copy)]
        assert len(grads[0]) == len(grads[1]) > 0
        assert relative_error(grads[1], grads[0]) < TOLERANCE, f'step {step}: gradients differ'
        for optimizer in optimizers:
            optimizer.step()
    eager.eval()
    compiled_copy.eval()
    with torch.no_grad():
        torch.manual_seed(0)
        expected = output_fn(eager)
        torch.manual_seed(0)
        got = output_fn(compiled)
    assert relative_error(got, expected) < TOLERANCE


def build(cfg):
    """The config's model in its scope, as the Runner builds it (custom imports, preprocessor)."""
    from polaformerpp.analysis import load_model
    model = load_model(cfg)
    return model.train()


# ----------------------------------------------------------------------------- classification
@pytest.mark.parametrize('backend', [FAST, INDUCTOR])
def test_classifier_compiles_for_training_and_evaluation(backend):
    if backend == 'inductor':
        # in an interpreter of its own: the test worker never loads the generated C++ libraries
        in_new_interpreter(check_classifier_one_thread, backend)
    else:
        check_classifier(backend)


def check_classifier_one_thread(backend):
    """:func:`check_classifier` under the settings the fixture gives each test here (for a new interpreter)."""
    with one_thread_fresh_compiler():
        check_classifier(backend)


def check_classifier(backend):
    """The classifier's loss (training) and logits (evaluation), eager against ``backend``."""
    from mmengine.config import Config
    from mmpretrain.structures import DataSample
    cfg = Config.fromfile(CLASSIFIER)
    cfg.model.backbone.arch = dict(COMPILE_ARCH, cls_proj_channels=64)
    cfg.model.backbone.drop_path_rate = 0.0
    cfg.model.head.in_channels = 64
    cfg.model.head.num_classes = 5
    cfg.model.train_cfg = None  # Mixup / CutMix draw their own random numbers
    torch.manual_seed(0)
    model = build(cfg)
    images = torch.randn(*IMAGES)
    samples = [DataSample().set_gt_label(label) for label in (1, 3)]
    check_compiled_training_and_evaluation(
        model, lambda m: m(images, samples, mode='loss')['loss'], lambda m: m(images, mode='tensor'), backend)


# ----------------------------------------------------------------------------- detection
class BackboneNeck(nn.Module):
    """A detector's backbone and neck: image -> FPN levels."""

    def __init__(self, detector):
        super().__init__()
        self.backbone, self.neck = detector.backbone, detector.neck

    def forward(self, x):
        return self.neck(self.backbone(x))


def tiny_detector_cfg(config, **extra):
    """The detector of ``config`` on :data:`COMPILE_ARCH` (the FPN reads the backbone's ``out_indices``)."""
    cfg = load_cfg(config)
    dims = [COMPILE_ARCH['embed_dims'][i] for i in cfg.model.backbone.out_indices]
    options = {'model.backbone.arch': COMPILE_ARCH, 'model.backbone.drop_path_rate': 0.0,
               'model.backbone.init_cfg': None, 'model.neck.in_channels': dims, 'model.neck.out_channels': 32}
    options.update(extra)
    return load_cfg(config, **options)


@pytest.mark.parametrize('config', [
    pytest.param(MASK_RCNN_B2, id='mask-rcnn'),
    pytest.param(RETINANET_B2, id='retinanet', marks=pytest.mark.slow)])
def test_detector_backbone_and_neck_compile_for_training_and_evaluation(config):
    torch.manual_seed(0)
    network = BackboneNeck(build_detector(tiny_detector_cfg(config)))
    images = torch.randn(*IMAGES)

    def loss_fn(module):
        return sum(level.square().mean() for level in module(images))

    check_compiled_training_and_evaluation(network, loss_fn, lambda m: m(images), AOT_EAGER)


@pytest.mark.slow
def test_whole_retinanet_compiles_for_training_and_evaluation():
    cfg = tiny_detector_cfg(RETINANET_B2, **{'model.bbox_head.in_channels': 32, 'model.bbox_head.feat_channels': 32,
                                            'model.bbox_head.stacked_convs': 1, 'model.bbox_head.num_classes': 3})
    torch.manual_seed(0)
    detector = build_detector(cfg)
    data = demo_batch(detector, shapes=((3, 64, 96), (3, 80, 64)), num_classes=3, with_mask=False)

    def loss_fn(module):
        losses = module(data['inputs'], data['data_samples'], mode='loss')
        return sum(sum(v) if isinstance(v, list) else v for k, v in losses.items() if 'loss' in k)

    check_compiled_training_and_evaluation(
        detector, loss_fn, lambda m: m(data['inputs'], data['data_samples'], mode='tensor'), AOT_EAGER)


# ----------------------------------------------------------------------------- segmentation
@pytest.mark.slow
def test_lightham_segmentor_compiles_for_training_and_evaluation():
    from mmengine.config import Config
    cfg = Config.fromfile(LIGHTHAM)
    torch.manual_seed(0)
    segmentor = build_segmentor(cfg.model, crop=(64, 64), tiny=True, arch=COMPILE_ARCH)
    data = segmentor.data_preprocessor(seg_batch([(64, 64), (64, 64)], 150), True)
    # In float64 (default dtype too: the decomposition draws its bases in it). The Hamburger's
    # multiplicative updates and BatchNorm over two images amplify fp32 rounding differences between
    # eager and traced kernels: after one SGD step gradients differed by 1.3e-3 (relative) on one CPU.
    segmentor.double()
    data['inputs'] = data['inputs'].double()

    def loss_fn(module):
        losses = module(data['inputs'], data['data_samples'], mode='loss')
        return sum(v for k, v in losses.items() if 'loss' in k)

    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        check_compiled_training_and_evaluation(
            segmentor, loss_fn, lambda m: m(data['inputs'], data['data_samples'], mode='tensor'), AOT_EAGER)
    finally:
        torch.set_default_dtype(default_dtype)


# ----------------------------------------------------------------------------- super-resolution
def test_sr_restorer_compiles_for_training_and_evaluation():
    from mmengine.config import Config
    from mmengine.structures import BaseDataElement
    cfg = Config.fromfile(SR_X2)
    cfg.model.network.update(embed_dims=16, depths=(2, ), num_heads=2, window_size=8)
    torch.manual_seed(0)
    restorer = build(cfg)
    lr_images = torch.rand(2, 3, 20, 28) - 0.45  # not a multiple of the window: padded and masked
    samples = [BaseDataElement(gt_img=torch.randint(0, 256, (3, 40, 56), dtype=torch.uint8)) for _ in range(2)]
    check_compiled_training_and_evaluation(
        restorer, lambda m: m(lr_images, samples, mode='loss')['loss'], lambda m: m(lr_images, mode='tensor'),
        AOT_EAGER)


# ----------------------------------------------------------------------------- generation
def test_dit_compiles_for_training_and_evaluation():
    from mmengine.config import Config
    from mmengine.registry import MODELS

    import polaformerpp.generation  # noqa: F401 (registers DiT)
    cfg = Config.fromfile(DIT)
    torch.manual_seed(0)
    dit = MODELS.build(cfg.model.dit)
    for p in dit.parameters():  # DiT zero-initialises adaLN and the output layer
        nn.init.normal_(p, std=0.05)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, dit.in_channels, *dit.input_size, generator=generator)
    t = torch.tensor([10, 700])
    y = torch.tensor([1, 3])
    target = torch.randn(2, dit.out_channels, *dit.input_size, generator=generator)
    check_compiled_training_and_evaluation(
        dit, lambda m: (m(x, t, y) - target).square().mean(), lambda m: m(x, t, y), AOT_EAGER)


# ----------------------------------------------------------------------------- the tools
def test_train_and_test_tools_turn_compile_on_and_refuse_where_it_cannot_run(tmp_path, monkeypatch, capsys):
    from mmengine.config import Config

    from polaformerpp.engine import compile as engine_compile
    train = load_tool('tools/train.py')
    args = train.parse_args([CLASSIFIER, '--compile'])
    assert train.merge_args(Config.fromfile(CLASSIFIER), args).compile is True
    cfg = Config.fromfile(CLASSIFIER)
    cfg.compile = dict(backend='aot_eager')  # the config's own options are kept
    assert train.merge_args(cfg, args).compile == dict(backend='aot_eager')
    assert 'compile' not in train.merge_args(Config.fromfile(CLASSIFIER), train.parse_args([CLASSIFIER]))
    assert engine_compile.compile_unavailable_reason('cpu') is None  # this machine compiles (g++, torch 2.x)

    monkeypatch.setattr(engine_compile, 'compile_unavailable_reason', lambda *args, **kwargs: 'no C++ compiler')
    checkpoint = tmp_path / 'any.pth'
    checkpoint.write_bytes(b'')
    for tool, argv in (('tools/train.py', [CLASSIFIER, '--compile']),
                       ('tools/train.py', [CLASSIFIER, '--cfg-options', 'compile=True']),
                       ('tools/test.py', [CLASSIFIER, str(checkpoint), '--compile'])):
        with pytest.raises(SystemExit) as info:
            load_tool(tool).main(argv + ['--work-dir', str(tmp_path / 'work')])
        err = capsys.readouterr().err
        assert info.value.code == 1, err
        assert 'error:' in err and 'torch.compile cannot run here: no C++ compiler' in err, err
