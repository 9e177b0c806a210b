"""ADE20K semantic segmentation configs (mmseg 1.2): the authors' recipe and test
protocol as the built model, optimizer and schedulers see them, every
config builds and runs a loss and a predict forward, the CPU tools' SyncBN switch,
FLOP counting of segmentors."""
import glob
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.config import Config

from conftest import REPO_ROOT, load_tool
from recipe_testing import (
    authors_name,
    build_model,
    decayed_names,
    images_per_iteration,
    lr_at,
    norm_training_modes,
    optimizer_groups,
)
from segmentation_testing import (
    DEMO_CONFIG,
    SEG_DIR,
    build_segmentor,
    init_mmseg,
    seg_batch,
    single_thread,  # noqa: F401 (fixtures)
)

# config -> (arch, decode head type)
ADE_CONFIGS = {
    'polapp-b1_lightham_8xb8-160k_ade20k-512x512.py': ('b1', 'LightHamHead'),
    'polapp-b2_lightham_8xb8-160k_ade20k-512x512.py': ('b2', 'LightHamHead'),
    'polapp-b3_lightham_8xb8-160k_ade20k-512x512.py': ('b3', 'LightHamHead'),
    'upernet_polapp-b2_8xb2-160k_ade20k-512x512.py': ('b2', 'UPerHead'),
}
ALL_CONFIGS = [osp.join(SEG_DIR, name) for name in ADE_CONFIGS] + [osp.join(REPO_ROOT, DEMO_CONFIG)]
LIGHTHAM_B1 = osp.join(SEG_DIR, 'polapp-b1_lightham_8xb8-160k_ade20k-512x512.py')
UPERNET_B2 = osp.join(SEG_DIR, 'upernet_polapp-b2_8xb2-160k_ade20k-512x512.py')


def stage_dims(cfg):
    arch = cfg.model.backbone.arch
    from polaformerpp.models.backbones import PolaFormerPP
    return arch['embed_dims'] if isinstance(arch, dict) else PolaFormerPP.arch_zoo[arch]['embed_dims']


def test_published_configs_exist_with_readme_and_metafile():
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
        cfg = Config.fromfile(osp.join(REPO_ROOT, m['Config']))
        assert m['Metadata']['Batch Size'] == images_per_iteration(cfg)


@pytest.mark.parametrize('name', sorted(ADE_CONFIGS))
def test_ade20k_config_carries_published_recipe(name):
    """The authors' release (downstream/segmentation/configs/PolaPP/polapp_b*.py and
    _base_/datasets/ade20k_repeat.py) for LightHam; Swin's UperNet recipe for UperNet."""
    cfg = Config.fromfile(osp.join(SEG_DIR, name))
    arch, head_type = ADE_CONFIGS[name]
    assert cfg.default_scope == 'mmseg'
    assert 'polaformerpp' in cfg.custom_imports.imports
    # backbone: the one class, ImageNet checkpoint through init_cfg, drop path of the arch
    bb = cfg.model.backbone
    assert bb.type == 'PolaFormerPP' and bb.arch == arch and bb.get('drop_path_rate') is None
    from polaformerpp.models.backbones import PolaFormerPP
    assert PolaFormerPP.arch_zoo[arch]['drop_path_rate'] == {'b1': 0.1, 'b2': 0.1, 'b3': 0.15}[arch]
    assert bb.attn_types == ('linear', 'linear', 'softmax', 'softmax')
    assert bb.norm_eval is True and bb.frozen_stages == -1
    assert bb.init_cfg == dict(type='Pretrained', checkpoint=cfg.pretrained, prefix='backbone.')
    assert arch in cfg.pretrained
    dims = stage_dims(cfg)
    head = cfg.model.decode_head
    assert head.type == head_type and head.num_classes == 150 and head.align_corners is False
    assert head.loss_decode == dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)
    stages = [bb.out_indices[i] for i in head.in_index]
    assert head.in_channels == [dims[s] for s in stages]
    if head_type == 'LightHamHead':
        assert stages == [1, 2, 3]  # stages 2-4
        assert head.channels == head.ham_channels == 512
        # MD_R 16 (theirs), the rest mmseg's NMF defaults
        assert head.ham_kwargs == dict(MD_S=1, MD_R=16, train_steps=6, eval_steps=7, inv_t=100,
                                       rand_init=True)
        assert head.norm_cfg == dict(type='GN', num_groups=32, requires_grad=True)
        assert head.dropout_ratio == 0.1
        assert images_per_iteration(cfg) == 64 and '_8xb8-' in name
        assert cfg.train_cfg.val_interval == cfg.default_hooks.checkpoint.interval == 8000
    else:
        assert stages == [0, 1, 2, 3] and head.pool_scales == (1, 2, 3, 6)
        aux = cfg.model.auxiliary_head
        assert aux.type == 'FCNHead' and aux.in_channels == dims[bb.out_indices[aux.in_index]]
        assert aux.loss_decode.loss_weight == 0.4
        assert images_per_iteration(cfg) == 16 and '_8xb2-' in name
        assert cfg.train_cfg.val_interval == cfg.default_hooks.checkpoint.interval == 16000
    assert cfg.auto_scale_lr.base_batch_size == images_per_iteration(cfg)
    # every backbone output is used (DDP without find_unused_parameters)
    used = set(stages)
    if cfg.model.get('auxiliary_head'):
        used.add(bb.out_indices[cfg.model.auxiliary_head.in_index])
    assert used == set(bb.out_indices)
    # optimisation: AdamW, fp32, no clipping, 160k iterations, mIoU
    assert cfg.optim_wrapper.type == 'OptimWrapper' and 'clip_grad' not in cfg.optim_wrapper
    opt = cfg.optim_wrapper.optimizer
    assert opt.type == 'AdamW' and opt.lr == 6e-5 and opt.betas == (0.9, 0.999)
    assert opt.weight_decay == 0.01
    assert cfg.train_cfg.type == 'IterBasedTrainLoop' and cfg.train_cfg.max_iters == 160000
    assert cfg.val_evaluator.iou_metrics == ['mIoU']
    # 512x512 crops padded with 0 (normalised image) / 255 (labels); the authors' augmentation
    pre = cfg.model.data_preprocessor
    assert pre.size == (512, 512) and pre.pad_val == 0 and pre.seg_pad_val == 255
    assert pre.mean == [123.675, 116.28, 103.53] and pre.std == [58.395, 57.12, 57.375]
    assert pre.bgr_to_rgb is True
    assert [t.type for t in cfg.train_pipeline] == [
        'LoadImageFromFile', 'LoadAnnotations', 'CheckSegMapShape', 'RandomResize', 'RandomCrop',
        'RandomFlip', 'PhotoMetricDistortion', 'PackSegInputs']
    train = {t.type: t for t in cfg.train_pipeline}
    assert train['LoadAnnotations'].reduce_zero_label is True
    assert train['RandomResize'] == dict(type='RandomResize', scale=(2048, 512), ratio_range=(0.5, 2.0),
                                         keep_ratio=True)
    assert train['RandomCrop'] == dict(type='RandomCrop', crop_size=(512, 512), cat_max_ratio=0.75)
    assert train['RandomFlip'].prob == 0.5 and train['PhotoMetricDistortion'] == dict(
        type='PhotoMetricDistortion')
    assert cfg.tta_model.type == 'SegTTAModel'


@pytest.mark.parametrize('name', sorted(ADE_CONFIGS))
def test_weight_decay_and_lr_multipliers_of_the_built_optimizer(name):
    """Their paramwise_cfg (polapp_b*.py:50-55, mmcv's matching: a key is a substring of
    the full name, the longest key first): no decay where their name holds 'norm',
    lr x10 on 'head' (LightHam; no multiplier in the UperNet recipe)."""
    cfg = Config.fromfile(osp.join(SEG_DIR, name))
    model = build_model(cfg)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    expected = {n for n in names if 'norm' not in authors_name(n)}
    decayed = decayed_names(cfg, model)
    assert decayed == expected
    # what that means in this project's names
    assert any('.stem.' in n and '.bn.' in n for n in decayed)  # their stem BNs: patch_embed.proj.k
    assert any(n.endswith('.gamma1') for n in decayed) and any(n.endswith('.temp_same') for n in decayed)
    assert not any('.norm' in n and n.startswith('backbone.') for n in decayed)
    assert not any('downsample.bn' in n for n in decayed)
    head_lr = 10 * 6e-5 if ADE_CONFIGS[name][1] == 'LightHamHead' else 6e-5
    for group in optimizer_groups(cfg, model):
        assert group['weight_decay'] in (0.0, 0.01)
        for n in group['names']:
            assert group['lr'] == pytest.approx(head_lr if n.startswith('decode_head.') else 6e-5), n


def test_learning_rate_follows_mmcv_poly_with_linear_warmup():
    """mmcv's PolyLrUpdaterHook (power 1.0, min_lr 0, max_iters 160000) times its linear
    warm-up (1500 iterations, warmup_ratio 1e-6), as polapp_b*.py:56-64 set them."""
    def authors(t, base=6e-5, total=160000, warmup=1500, ratio=1e-6):
        regular = (base - 0.0) * (1 - t / total) ** 1.0 + 0.0
        if t >= warmup:
            return regular
        k = (1 - t / warmup) * (1 - ratio)
        return regular * (1 - k)

    configs = [Config.fromfile(osp.join(SEG_DIR, n)) for n in sorted(ADE_CONFIGS)]
    assert all(c.param_scheduler == configs[0].param_scheduler for c in configs)
    its = [0, 1, 2, 750, 1498, 1499, 1500, 1501, 3000, 80000, 159998, 159999]
    for it, lr in zip(its, lr_at(configs[0], its)):
        assert lr == pytest.approx(authors(it), rel=1e-6, abs=1e-15), it


@pytest.mark.parametrize('name', sorted(ADE_CONFIGS))
def test_test_protocol_resizes_to_a_multiple_of_32_whole_image(name):
    """ade20k_repeat.py:19-34: resize to 2048x512 keeping the ratio, then resize (not pad) to
    a multiple of 32; whole-image inference, single scale; their --aug-test (tools/tgs.py)
    scales 2048x512 by 0.5-1.75, with and without flip."""
    cfg = Config.fromfile(osp.join(SEG_DIR, name))
    assert [t.type for t in cfg.test_pipeline] == [
        'LoadImageFromFile', 'Resize', 'ResizeToMultiple', 'LoadAnnotations', 'CheckSegMapShape',
        'PackSegInputs']
    assert cfg.test_pipeline[1] == dict(type='Resize', scale=(2048, 512), keep_ratio=True)
    assert cfg.test_pipeline[2] == dict(type='ResizeToMultiple', size_divisor=32)
    assert cfg.val_dataloader.dataset.pipeline == cfg.test_pipeline
    assert cfg.test_dataloader == cfg.val_dataloader and cfg.val_dataloader.batch_size == 1
    assert cfg.model.test_cfg == dict(mode='whole')
    assert cfg.model.data_preprocessor.get('test_cfg') is None  # nothing padded at test time
    # on an image: 375x500 -> 512x683 -> 512x704 (ceil to a multiple of 32, bilinear)
    init_mmseg()
    from mmseg.registry import TRANSFORMS
    results = dict(img=np.zeros((375, 500, 3), np.uint8))
    for t in cfg.test_pipeline[1:3]:
        results = TRANSFORMS.build(t)(results)
    assert results['img'].shape[:2] == results['img_shape'] == (512, 704)
    views = cfg.tta_pipeline[1].transforms
    assert [v.scale for v in views[0]] == [(1024, 256), (1536, 384), (2048, 512), (2560, 640),
                                           (3072, 768), (3584, 896)]
    assert all(v.keep_ratio for v in views[0]) and views[1] == [cfg.test_pipeline[2]]
    assert [(v.type, v.prob) for v in views[2]] == [('RandomFlip', 0.0), ('RandomFlip', 1.0)]


@pytest.mark.parametrize('name', sorted(ADE_CONFIGS))
def test_norm_layers_mode_while_training(name):
    """Their PolaPP.train() (norm_eval=True): the backbone's BatchNorms (stem and
    downsampling) in eval mode, its LayerNorms and the heads' norms training."""
    cfg = Config.fromfile(osp.join(SEG_DIR, name))
    model = build_model(cfg)
    modes = norm_training_modes(model)
    bn = torch.nn.modules.batchnorm._BatchNorm
    kinds = {n: type(m) for n, m in model.named_modules()}
    backbone_bn = {n for n in modes if n.startswith('backbone.') and issubclass(kinds[n], bn)}
    assert backbone_bn and not any(modes[n] for n in backbone_bn)
    assert all(modes[n] for n in modes if n not in backbone_bn)
    assert any(n.startswith('decode_head.') for n in modes)


def test_converted_authors_checkpoint_takes_their_raw_weights():
    """Their loader (mmcv_custom.load_checkpoint through PolaPP.init_weights, PolaPP.py:483-503)
    reads the checkpoint's 'model' entry: the raw, not the EMA, weights."""
    select = load_tool('tools/model_converters/polapp_official2mm.py').select_state_dict
    raw, ema = {'w': torch.zeros(1)}, {'w': torch.ones(1)}
    state, entry = select({'model': raw, 'state_dict_ema': ema})
    assert entry == 'model' and state['w'].item() == 0.0


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
    cfg = Config.fromfile(UPERNET_B2)
    assert cfg.model.decode_head.norm_cfg.type == 'SyncBN'
    adapt_cfg_to_device(cfg)
    assert cfg.model.decode_head.norm_cfg.type == 'BN'
    assert cfg.model.auxiliary_head.norm_cfg.type == 'BN'


def test_get_flops_counts_segmentors():
    get_flops = load_tool('tools/analysis_tools/get_flops.py').get_flops
    path = LIGHTHAM_B1
    result = get_flops(path, shape=(64, 96), cfg_options={'model.backbone.init_cfg': None})
    assert result['shape'] == (64, 96)
    assert result['flops'] > 0 and 5e6 < result['params'] < 1e7  # b1 backbone + LightHam
