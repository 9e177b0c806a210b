"""ADE20K semantic segmentation configs (mmseg 1.2): the published recipe, every
config builds and runs a loss and a predict forward, the CPU tools' SyncBN switch,
FLOP counting of segmentors."""
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from conftest import REPO_ROOT, load_tool
from segmentation_testing import (
    DEMO_CONFIG,
    SEG_DIR,
    build_segmentor,
    seg_batch,
    single_thread,  # noqa: F401 (fixtures)
)

# config -> (arch, decode head type)
ADE_CONFIGS = {
    'polapp-b1_lightham_8xb2-160k_ade20k-512x512.py': ('b1', 'LightHamHead'),
    'polapp-b2_lightham_8xb2-160k_ade20k-512x512.py': ('b2', 'LightHamHead'),
    'polapp-b3_lightham_8xb2-160k_ade20k-512x512.py': ('b3', 'LightHamHead'),
    'upernet_polapp-b2_8xb2-160k_ade20k-512x512.py': ('b2', 'UPerHead'),
}
ALL_CONFIGS = [osp.join(SEG_DIR, name) for name in ADE_CONFIGS] + [osp.join(REPO_ROOT, DEMO_CONFIG)]


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
