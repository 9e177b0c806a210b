"""ADE20K semantic segmentation (mmseg): configs, the backbone inside segmentors,
whole/sliding inference, data checks, and (slow) end to end through the tools."""
import copy
import glob
import json
import os
import os.path as osp
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from mmengine.config import Config
from PIL import Image

from conftest import REPO_ROOT, free_port, load_tool, run_tool

SEG_DIR = osp.join(REPO_ROOT, 'configs', 'segmentation')
# config -> (arch, decode head type)
ADE_CONFIGS = {
    'polapp-b1_lightham_8xb2-160k_ade20k-512x512.py': ('b1', 'LightHamHead'),
    'polapp-b2_lightham_8xb2-160k_ade20k-512x512.py': ('b2', 'LightHamHead'),
    'polapp-b3_lightham_8xb2-160k_ade20k-512x512.py': ('b3', 'LightHamHead'),
    'upernet_polapp-b2_8xb2-160k_ade20k-512x512.py': ('b2', 'UPerHead'),
}
DEMO_CONFIG = 'configs/segmentation/polapp-b1_lightham_1xb8-1k_demo-ade20k-64x64.py'
ALL_CONFIGS = [osp.join(SEG_DIR, name) for name in ADE_CONFIGS] + [osp.join(REPO_ROOT, DEMO_CONFIG)]
TINY_ARCH = dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 3, 4])
DEMO_CLASSES = ('sky', 'grass', 'disk', 'box', 'triangle')


@pytest.fixture(autouse=True, scope='module')
def single_thread():
    """These tests run tiny models: one intra-op thread is faster, above all on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _init_mmseg():
    import polaformerpp  # noqa: F401
    import polaformerpp.datasets.seg_checks  # noqa: F401
    from mmengine.registry import init_default_scope
    init_default_scope('mmseg')


def _sync_bn_to_bn(node):
    if isinstance(node, dict):
        if node.get('type') == 'SyncBN':
            node['type'] = 'BN'
        for value in node.values():
            _sync_bn_to_bn(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _sync_bn_to_bn(value)


def build_segmentor(model_cfg, crop=(64, 64), tiny=False, **backbone):
    """The config's segmentor without its checkpoint, SyncBN as BN, training crops of ``crop``."""
    _init_mmseg()
    from mmseg.registry import MODELS
    model_cfg = copy.deepcopy(model_cfg)
    model_cfg.backbone.init_cfg = None
    model_cfg.data_preprocessor.size = crop
    if tiny:
        model_cfg.backbone.arch = copy.deepcopy(TINY_ARCH)
        model_cfg.backbone.drop_path_rate = 0.0
        shrink_heads(model_cfg, TINY_ARCH['embed_dims'])
    model_cfg.backbone.update(backbone)
    _sync_bn_to_bn(model_cfg)
    model = MODELS.build(model_cfg)
    model.init_weights()
    return model


def shrink_heads(model_cfg, dims, channels=64):
    """Heads matching backbone channels ``dims`` with ``channels`` inner channels."""
    out = model_cfg.backbone.out_indices
    for key in ('decode_head', 'auxiliary_head'):
        head = model_cfg.get(key)
        if head is None:
            continue
        idx = head.in_index
        head.in_channels = ([dims[out[i]] for i in idx] if isinstance(idx, (list, tuple))
                            else dims[out[idx]])
        head.channels = channels
        if 'ham_channels' in head:
            head.ham_channels = channels


def seg_batch(sizes, num_classes, seed=0):
    """Raw (uint8 image, gt) data as the dataloader gives it, for ``model.data_preprocessor``."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    g = torch.Generator().manual_seed(seed)
    inputs, samples = [], []
    for h, w in sizes:
        inputs.append(torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8))
        label = torch.randint(0, num_classes, (1, h, w), generator=g)
        label[:, :2] = 255  # some ignored pixels
        sample = SegDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w)))
        sample.gt_sem_seg = PixelData(data=label)
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def stage_dims(cfg):
    arch = cfg.model.backbone.arch
    from polaformerpp.models.backbones import PolaFormerPP
    return arch['embed_dims'] if isinstance(arch, dict) else PolaFormerPP.arch_zoo[arch]['embed_dims']


# ----------------------------------------------------------------------------- configs

def test_issue_configs_exist_with_readme_and_metafile():
    names = {osp.basename(p) for p in glob.glob(osp.join(SEG_DIR, '*.py'))}
    assert set(ADE_CONFIGS) <= names
    assert osp.isfile(osp.join(SEG_DIR, 'README.md'))
    import yaml
    with open(osp.join(SEG_DIR, 'metafile.yml')) as f:
        meta = yaml.safe_load(f)
    listed = {osp.basename(m['Config']) for m in meta['Models']}
    assert listed == set(ADE_CONFIGS)
    for m in meta['Models']:
        assert osp.isfile(osp.join(REPO_ROOT, m['Config']))


@pytest.mark.parametrize('name', sorted(ADE_CONFIGS))
def test_ade20k_config_carries_published_recipe(name):
    cfg = Config.fromfile(osp.join(SEG_DIR, name))
    arch, head_type = ADE_CONFIGS[name]
    assert cfg.default_scope == 'mmseg'
    assert 'polaformerpp' in cfg.custom_imports.imports
    # backbone: the one class, ImageNet checkpoint through init_cfg
    bb = cfg.model.backbone
    assert bb.type == 'PolaFormerPP' and bb.arch == arch
    assert bb.init_cfg == dict(type='Pretrained', checkpoint=cfg.pretrained, prefix='backbone.')
    assert arch in cfg.pretrained
    dims = stage_dims(cfg)
    head = cfg.model.decode_head
    assert head.type == head_type and head.num_classes == 150 and head.align_corners is False
    stages = [bb.out_indices[i] for i in head.in_index]
    assert head.in_channels == [dims[s] for s in stages]
    if head_type == 'LightHamHead':
        assert stages == [1, 2, 3]  # stages 2-4
        assert head.channels == head.ham_channels == 512
        assert head.ham_kwargs.MD_R == 16
        assert head.norm_cfg == dict(type='GN', num_groups=32, requires_grad=True)
        assert head.dropout_ratio == 0.1
        assert cfg.optim_wrapper.paramwise_cfg.custom_keys['head'] == dict(lr_mult=10.0)
    else:
        assert stages == [0, 1, 2, 3] and head.pool_scales == (1, 2, 3, 6)
        aux = cfg.model.auxiliary_head
        assert aux.type == 'FCNHead' and aux.in_channels == dims[bb.out_indices[aux.in_index]]
        assert aux.loss_decode.loss_weight == 0.4
    # every backbone output is used (DDP without find_unused_parameters)
    used = set(stages)
    if cfg.model.get('auxiliary_head'):
        used.add(bb.out_indices[cfg.model.auxiliary_head.in_index])
    assert used == set(bb.out_indices)
    # optimisation
    opt = cfg.optim_wrapper.optimizer
    assert opt.type == 'AdamW' and opt.lr == 6e-5 and opt.weight_decay == 0.01
    pw = cfg.optim_wrapper.paramwise_cfg
    assert pw.norm_decay_mult == 0.0
    for key in ('.gamma1', '.gamma2', '.temp_same', '.temp_opp'):
        assert pw.custom_keys[key] == dict(decay_mult=0.0)
    warmup, poly = cfg.param_scheduler
    assert warmup.type == 'LinearLR' and warmup.end == 1500 and not warmup.by_epoch
    assert poly.type == 'PolyLR' and poly.power == 1.0 and poly.begin == 1500 and poly.end == 160000
    assert cfg.train_cfg.max_iters == 160000 and cfg.train_cfg.val_interval == 16000
    assert cfg.val_evaluator.iou_metrics == ['mIoU']
    # 8 GPUs x 2 images, 512x512 crops, standard augmentation, whole-image single-scale test
    assert cfg.train_dataloader.batch_size == 2 and '_8xb2-' in name
    assert cfg.auto_scale_lr.base_batch_size == 16
    assert cfg.model.data_preprocessor.size == (512, 512)
    train = {t.type: t for t in cfg.train_pipeline}
    assert train['RandomResize'].scale == (2048, 512) and train['RandomResize'].ratio_range == (0.5, 2.0)
    assert train['RandomCrop'].crop_size == (512, 512)
    assert {'RandomFlip', 'PhotoMetricDistortion', 'CheckSegMapShape'} <= set(train)
    assert train['LoadAnnotations'].reduce_zero_label is True
    assert cfg.model.test_cfg.mode == 'whole'
    assert cfg.tta_model.type == 'SegTTAModel' and cfg.tta_pipeline[1].type == 'TestTimeAug'


@pytest.mark.parametrize('path', ALL_CONFIGS, ids=osp.basename)
def test_config_builds_and_runs_loss_and_predict(path):
    cfg = Config.fromfile(path)
    model = build_segmentor(cfg.model)
    num_classes = cfg.model.decode_head.num_classes
    model.train()
    data = model.data_preprocessor(seg_batch([(64, 64), (57, 50)], num_classes), True)
    assert tuple(data['inputs'].shape) == (2, 3, 64, 64)
    losses = model(**data, mode='loss')
    assert torch.isfinite(losses['decode.loss_ce'])
    if cfg.model.get('auxiliary_head'):
        assert torch.isfinite(losses['aux.loss_ce'])
    model.eval()
    with torch.no_grad():
        preds = model.test_step(seg_batch([(61, 77)], num_classes))
    assert preds[0].pred_sem_seg.shape == (61, 77)
    assert preds[0].seg_logits.data.shape == (num_classes, 61, 77)


def test_cpu_tools_switch_sync_bn_to_bn():
    if torch.cuda.is_available():
        pytest.skip('the switch applies on machines without CUDA')
    from polaformerpp.utils import adapt_cfg_to_device
    cfg = Config.fromfile(osp.join(SEG_DIR, 'upernet_polapp-b2_8xb2-160k_ade20k-512x512.py'))
    assert cfg.model.decode_head.norm_cfg.type == 'SyncBN'
    adapt_cfg_to_device(cfg)
    assert cfg.model.decode_head.norm_cfg.type == 'BN'
    assert cfg.model.auxiliary_head.norm_cfg.type == 'BN'


def test_get_flops_counts_segmentors():
    get_flops = load_tool('tools/analysis_tools/get_flops.py').get_flops
    path = osp.join(SEG_DIR, 'polapp-b1_lightham_8xb2-160k_ade20k-512x512.py')
    result = get_flops(path, shape=(64, 96), cfg_options={'model.backbone.init_cfg': None})
    assert result['shape'] == (64, 96)
    assert result['flops'] > 0 and 5e6 < result['params'] < 1e7  # b1 backbone + LightHam


# ----------------------------------------------------------------------------- backbone in mmseg

@pytest.mark.parametrize('head', ['lightham', 'upernet'])
@pytest.mark.parametrize('size', [(83, 121), (45, 70)])
def test_whole_and_slide_inference_at_sizes_not_divisible_by_32(head, size):
    name = ('polapp-b1_lightham_8xb2-160k_ade20k-512x512.py' if head == 'lightham'
            else 'upernet_polapp-b2_8xb2-160k_ade20k-512x512.py')
    cfg = Config.fromfile(osp.join(SEG_DIR, name))
    model = build_segmentor(cfg.model, tiny=True).eval()
    h, w = size
    results = {}
    for mode, test_cfg in (('whole', dict(mode='whole')),
                           ('slide', dict(mode='slide', crop_size=(48, 48), stride=(32, 32))),
                           ('one_window', dict(mode='slide', crop_size=(256, 256), stride=(170, 170)))):
        model.test_cfg = Config(test_cfg)
        torch.manual_seed(0)  # LightHam's NMF starts from random bases
        with torch.no_grad():
            pred = model.test_step(seg_batch([size], 150))[0]
        assert pred.pred_sem_seg.shape == (h, w), mode
        assert pred.seg_logits.data.shape == (150, h, w), mode
        assert torch.isfinite(pred.seg_logits.data).all(), mode
        results[mode] = pred.seg_logits.data
    # a window covering the whole (padded) image is whole-image inference
    torch.testing.assert_close(results['one_window'], results['whole'], rtol=1e-4, atol=1e-4)


def _tiny_classifier_checkpoint(path):
    """A classification-style checkpoint: backbone weights under ``backbone.`` plus a head."""
    from polaformerpp.models.backbones import PolaFormerPP
    backbone = PolaFormerPP(arch=copy.deepcopy(TINY_ARCH), out_indices=(4, ))
    backbone.init_weights()
    for p in backbone.parameters():  # distinguishable from a fresh initialisation
        p.data.uniform_(-1, 1)
    state = {f'backbone.{k}': v for k, v in backbone.state_dict().items()}
    state['head.fc.weight'] = torch.zeros(10, 2048)
    torch.save(dict(state_dict=state, meta=dict()), path)
    return state


def test_backbone_loads_imagenet_checkpoint_through_init_cfg(tmp_path):
    ckpt = str(tmp_path / 'polapp-tiny_in1k.pth')
    state = _tiny_classifier_checkpoint(ckpt)
    cfg = Config.fromfile(osp.join(SEG_DIR, 'upernet_polapp-b2_8xb2-160k_ade20k-512x512.py'))
    _init_mmseg()
    from mmseg.registry import MODELS
    model_cfg = copy.deepcopy(cfg.model)
    model_cfg.backbone.arch = copy.deepcopy(TINY_ARCH)
    shrink_heads(model_cfg, TINY_ARCH['embed_dims'])
    model_cfg.backbone.init_cfg = dict(type='Pretrained', checkpoint=ckpt, prefix='backbone.')
    _sync_bn_to_bn(model_cfg)
    model = MODELS.build(model_cfg)
    model.init_weights()
    loaded = model.backbone.state_dict()
    for key, value in loaded.items():
        if key.startswith('norm'):  # the dense outputs' norms are new (missing in the checkpoint)
            assert f'backbone.{key}' not in state
            continue
        torch.testing.assert_close(value, state[f'backbone.{key}'], msg=key)
    assert not hasattr(model.backbone, 'cls_proj')  # the classifier's projection is not built


def test_frozen_stages_and_norm_eval_are_honoured():
    cfg = Config.fromfile(osp.join(SEG_DIR, 'polapp-b1_lightham_8xb2-160k_ade20k-512x512.py'))
    model = build_segmentor(cfg.model, tiny=True, frozen_stages=2, norm_eval=True)
    model.train()
    bb = model.backbone
    frozen = [bb.stem, bb.stages[0], bb.stages[1]]
    assert all(not p.requires_grad for m in frozen for p in m.parameters())
    assert all(p.requires_grad for p in bb.stages[2].parameters())
    bns = [m for m in bb.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and all(not m.training for m in bns)
    assert model.decode_head.training
    data = model.data_preprocessor(seg_batch([(64, 64), (64, 64)], 150), True)
    losses = model(**data, mode='loss')
    losses['decode.loss_ce'].backward()
    assert all(p.grad is None for m in frozen for p in m.parameters())
    assert bb.stages[3].blocks[0].gamma1.grad is not None


# ----------------------------------------------------------------------------- data

@pytest.fixture(scope='module')
def demo_ade(tmp_path_factory):
    make = load_tool('tools/misc/make_demo_ade20k.py').make_demo_ade20k
    root = str(tmp_path_factory.mktemp('demo_ade20k'))
    make(root, num_train=6, num_val=3, seed=1)
    return root


def test_demo_generator_writes_ade20k_layout(demo_ade, tmp_path):
    for split, count in (('training', 6), ('validation', 3)):
        imgs = sorted(glob.glob(osp.join(demo_ade, 'images', split, '*.jpg')))
        anns = sorted(glob.glob(osp.join(demo_ade, 'annotations', split, '*.png')))
        assert len(imgs) == len(anns) == count
        for img, ann in zip(imgs, anns):
            assert osp.basename(img)[:-4] == osp.basename(ann)[:-4]
            label = Image.open(ann)
            assert label.mode == 'L' and label.size == Image.open(img).size
            values = set(np.unique(np.asarray(label)).tolist())
            assert values <= set(range(len(DEMO_CLASSES) + 1))  # 0 other, classes 1..5
            assert {0, 1, 2} <= values  # rims are "other"; sky and grass are always there
    with open(osp.join(demo_ade, 'classes.txt')) as f:
        assert tuple(f.read().split()) == DEMO_CLASSES
    # deterministic per seed
    make = load_tool('tools/misc/make_demo_ade20k.py').make_demo_ade20k
    make(str(tmp_path), num_train=6, num_val=3, seed=1)
    for rel in ('annotations/training/demo_t0003.png', 'images/validation/demo_v0002.jpg'):
        with open(osp.join(demo_ade, rel), 'rb') as a, open(osp.join(tmp_path, rel), 'rb') as b:
            assert a.read() == b.read()


def _dataset(root, pipeline, split='training', type='CheckedADE20KDataset', **kwargs):
    _init_mmseg()
    from mmseg.registry import DATASETS
    return DATASETS.build(dict(
        type=type, data_root=root, pipeline=pipeline,
        data_prefix=dict(img_path=f'images/{split}', seg_map_path=f'annotations/{split}'), **kwargs))


def test_ade20k_pipelines_on_ade20k_format_files(demo_ade):
    cfg = Config.fromfile(osp.join(SEG_DIR, 'polapp-b2_lightham_8xb2-160k_ade20k-512x512.py'))
    train = _dataset(demo_ade, cfg.train_pipeline)
    assert len(train) == 6 and train.metainfo['reduce_zero_label'] is True
    sample = train[0]
    h, w = sample['inputs'].shape[1:]
    assert h <= 512 and w <= 512  # resized to 0.5-2.0 of 2048x512, cropped to at most 512x512
    assert sample['data_samples'].gt_sem_seg.shape == (h, w)
    labels = set(sample['data_samples'].gt_sem_seg.data.unique().tolist())
    assert labels <= set(range(5)) | {255}  # reduce_zero_label: 0 -> 255, k -> k - 1

    test = _dataset(demo_ade, cfg.test_pipeline, 'validation', test_mode=True)
    sample = test[0]
    ori = Image.open(sample['data_samples'].img_path).size[::-1]
    assert sample['data_samples'].ori_shape == ori
    assert min(sample['inputs'].shape[1:]) == 512 or max(sample['inputs'].shape[1:]) == 2048
    assert sample['data_samples'].gt_sem_seg.shape == ori  # metrics at the original size

    tta = _dataset(demo_ade, cfg.tta_pipeline, 'validation', test_mode=True)
    views = tta[0]
    assert len(views['inputs']) == len(views['data_samples']) == 12  # 6 scales x 2 flips
    assert [s.flip for s in views['data_samples']].count(True) == 6
    assert all(s.gt_sem_seg.shape == ori for s in views['data_samples'])


def _copy_demo(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


def test_label_size_mismatch_is_a_clear_error(demo_ade, tmp_path):
    root = _copy_demo(demo_ade, tmp_path / 'data')
    png = sorted(glob.glob(osp.join(root, 'annotations', 'training', '*.png')))[0]
    label = Image.open(png)
    label.resize((label.width + 3, label.height), Image.NEAREST).save(png)
    cfg = Config.fromfile(osp.join(REPO_ROOT, DEMO_CONFIG))
    for pipeline in (cfg.train_pipeline, cfg.test_pipeline):
        ds = _dataset(root, pipeline, type='CheckedSegDataset', metainfo=dict(classes=DEMO_CLASSES),
                      reduce_zero_label=True)
        with pytest.raises(ValueError, match=r'label map .*demo_t0000\.png is \d+x\d+ .*but its image '
                                             r'.*demo_t0000\.jpg is \d+x\d+'):
            ds[0]
        ds[1]  # the others load
    # an RGB label map is refused too
    Image.open(png).convert('RGB').save(png)
    ds = _dataset(root, cfg.test_pipeline, type='CheckedSegDataset', metainfo=dict(classes=DEMO_CLASSES),
                  reduce_zero_label=True)
    with pytest.raises(ValueError, match='single-channel'):
        ds[0]


def test_empty_or_missing_split_is_a_clear_error(demo_ade, tmp_path):
    root = str(tmp_path / 'ade')
    os.makedirs(osp.join(root, 'images', 'training'))
    os.makedirs(osp.join(root, 'annotations', 'training'))
    with pytest.raises(ValueError,
                       match=r"split is empty: no images ending in '\.jpg' under .*images/training"):
        _dataset(root, [])
    with pytest.raises(FileNotFoundError, match=r'image folder .*images/validation.* does not exist'):
        _dataset(root, [], split='validation')
    # images without label maps
    data = _copy_demo(demo_ade, tmp_path / 'data')
    os.remove(osp.join(data, 'annotations', 'training', 'demo_t0002.png'))
    with pytest.raises(FileNotFoundError, match=r'1 of 6 images have no label map .*demo_t0002\.png'):
        _dataset(data, [])


# ----------------------------------------------------------------------------- end to end (slow)

def _data_options(root):
    return [f'{key}.dataset.data_root={root}'
            for key in ('train_dataloader', 'val_dataloader', 'test_dataloader')]


TINY_OPTIONS = [
    'model.backbone.arch._delete_=True',
    'model.backbone.arch.embed_dims=[16,32,48,64]',
    'model.backbone.arch.depths=[1,1,1,1]',
    'model.backbone.arch.num_heads=[1,2,3,4]',
    'model.decode_head.in_channels=[32,48,64]',
    'model.decode_head.channels=64',
    'model.decode_head.ham_channels=64',
]


ONE_THREAD = dict(OMP_NUM_THREADS='1')  # tiny models; the machine may be shared


def _read_scalars(work_dir):
    logs = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    assert logs, f'no scalars.json under {work_dir}'
    with open(logs[-1]) as f:
        return [json.loads(line) for line in f if line.strip()]


def majority_class_miou(root, num_classes=len(DEMO_CLASSES)):
    """mIoU (%) of predicting the most frequent class everywhere on the validation labels."""
    counts = np.zeros(256, np.int64)
    for png in glob.glob(osp.join(root, 'annotations', 'validation', '*.png')):
        counts += np.bincount(np.asarray(Image.open(png)).ravel(), minlength=256)
    counts = counts[1:num_classes + 1]  # reduce_zero_label: 0 is ignored
    # the majority class has IoU count/total, every other present class IoU 0
    return 100.0 * counts.max() / counts.sum() / np.count_nonzero(counts)


@pytest.fixture(scope='module')
def demo_ade_e2e(tmp_path_factory):
    make = load_tool('tools/misc/make_demo_ade20k.py').make_demo_ade20k
    root = str(tmp_path_factory.mktemp('demo_ade20k_e2e'))
    make(root, num_train=48, num_val=16, seed=0)
    return root


@pytest.mark.slow
def test_lightham_trains_and_evaluates_through_the_tools(demo_ade_e2e, tmp_path):
    work_dir = str(tmp_path / 'work')
    iters = 300
    run_tool(['tools/train.py', DEMO_CONFIG, '--work-dir', work_dir, '--cfg-options',
              *_data_options(demo_ade_e2e), *TINY_OPTIONS, f'train_cfg.max_iters={iters}',
              f'train_cfg.val_interval={iters}', f'param_scheduler.1.end={iters}',
              f'default_hooks.checkpoint.interval={iters}', 'train_dataloader.num_workers=1',
              'val_dataloader.num_workers=0'], env=ONE_THREAD)
    records = [r for r in _read_scalars(work_dir) if 'loss' in r]
    first = sum(r['loss'] for r in records[:3]) / 3
    last = sum(r['loss'] for r in records[-3:]) / 3
    assert last < 0.5 * first, (first, last)

    ckpt = osp.join(work_dir, f'iter_{iters}.pth')
    assert osp.isfile(ckpt)
    baseline = majority_class_miou(demo_ade_e2e)
    common = ['--work-dir', work_dir, '--cfg-options', *_data_options(demo_ade_e2e), *TINY_OPTIONS,
              'test_dataloader.num_workers=0']
    metrics = {}
    for tta in (False, True):
        out = str(tmp_path / f'metrics_tta{int(tta)}.json')
        run_tool(['tools/test.py', DEMO_CONFIG, ckpt, '--out-json', out, *(['--tta'] if tta else []),
                  *common], env=ONE_THREAD)
        with open(out) as f:
            metrics[tta] = json.load(f)
    miou, miou_tta = float(metrics[False]['mIoU']), float(metrics[True]['mIoU'])
    assert miou > max(3 * baseline, baseline + 30), (miou, baseline)
    assert miou_tta > max(3 * baseline, baseline + 30), (miou_tta, baseline)


@pytest.mark.slow
def test_dist_train_two_cpu_processes(demo_ade_e2e, tmp_path):
    work_dir = str(tmp_path / 'dist')
    proc = run_tool(['tools/dist_train.sh', DEMO_CONFIG, '2', '--work-dir', work_dir,
                     '--cfg-options', *_data_options(demo_ade_e2e), *TINY_OPTIONS,
                     'train_cfg.max_iters=6', 'train_cfg.val_interval=6', 'param_scheduler.0.end=2',
                     'param_scheduler.1.begin=2', 'param_scheduler.1.end=6',
                     'default_hooks.checkpoint.interval=6', 'default_hooks.logger.interval=2',
                     'train_dataloader.batch_size=2', 'train_dataloader.num_workers=0',
                     'val_dataloader.num_workers=0'],
                    env=dict(PORT=str(free_port()), OMP_NUM_THREADS='1'))
    log = proc.stdout + proc.stderr
    assert 'Distributed training: True' in log and 'GPU number: 2' in log, log[-3000:]
    assert osp.isfile(osp.join(work_dir, 'iter_6.pth'))
    assert any('mIoU' in r for r in _read_scalars(work_dir))


@pytest.mark.slow
def test_train_tool_reports_an_empty_split(tmp_path):
    root = str(tmp_path / 'empty')
    for sub in ('images/training', 'annotations/training', 'images/validation', 'annotations/validation'):
        os.makedirs(osp.join(root, sub))
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, 'tools/train.py', DEMO_CONFIG, '--work-dir', str(tmp_path / 'w'),
                           '--cfg-options', *_data_options(root)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert 'CheckedSegDataset: the split is empty' in proc.stderr, proc.stderr[-3000:]
