# The segmentation demo: PolaFormer++-b1 + LightHam trained briefly on the CPU,
# from scratch, on the generated ADE20K-format set (tools/misc/make_demo_ade20k.py:
# images/{training,validation}/*.jpg, annotations/{training,validation}/*.png,
# label 0 = "other" ignored through reduce_zero_label, 5 classes), 64x64 crops,
# evaluated with mmseg's IoUMetric.
#   python tools/misc/make_demo_ade20k.py data/demo_ade20k
#   python tools/train.py configs/segmentation/polapp-b1_lightham_1xb8-1k_demo-ade20k-64x64.py
_base_ = ['./polapp-b1_lightham_8xb8-160k_ade20k-512x512.py']

data_root = 'data/demo_ade20k'
metainfo = dict(
    classes=('sky', 'grass', 'disk', 'box', 'triangle'),
    palette=[[70, 130, 220], [60, 170, 60], [220, 60, 40], [230, 200, 40], [170, 60, 200]])
crop_size = (64, 64)

model = dict(
    data_preprocessor=dict(size=crop_size),
    # from scratch: the BatchNorms must learn their statistics (the published
    # configs keep them in eval mode over an ImageNet initialisation)
    backbone=dict(drop_path_rate=0.0, init_cfg=None, norm_eval=False),
    decode_head=dict(num_classes=5))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='CheckSegMapShape'),
    dict(type='RandomResize', scale=(128, 64), ratio_range=(0.75, 1.5), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(128, 64), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='CheckSegMapShape'),
    dict(type='PackSegInputs'),
]
tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(
        type='TestTimeAug',
        transforms=[
            [dict(type='Resize', scale_factor=r, keep_ratio=True) for r in (0.75, 1.0, 1.25)],
            [
                dict(type='RandomFlip', prob=0., direction='horizontal'),
                dict(type='RandomFlip', prob=1., direction='horizontal'),
            ],
            [dict(type='LoadAnnotations')],
            [dict(type='CheckSegMapShape')],
            [dict(type='PackSegInputs')],
        ]),
]
demo_dataset = dict(
    type='CheckedSegDataset',
    data_root=data_root,
    metainfo=metainfo,
    reduce_zero_label=True,
    img_suffix='.jpg',
    seg_map_suffix='.png')
train_dataloader = dict(
    batch_size=8,
    num_workers=2,
    persistent_workers=False,
    dataset=dict(**demo_dataset, pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1,
    num_workers=2,
    persistent_workers=False,
    dataset=dict(**demo_dataset, pipeline=test_pipeline))
test_dataloader = val_dataloader

max_iters = 1000
warmup_iters = 50
optim_wrapper = dict(optimizer=dict(lr=1e-3))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=warmup_iters),
    dict(type='PolyLR', power=1.0, eta_min=0.0, by_epoch=False, begin=warmup_iters, end=max_iters),
]
train_cfg = dict(max_iters=max_iters, val_interval=max_iters)
default_hooks = dict(
    logger=dict(interval=10),
    checkpoint=dict(interval=max_iters, max_keep_ckpts=1))
env_cfg = dict(cudnn_benchmark=False)
randomness = dict(seed=0)
auto_scale_lr = dict(base_batch_size=8)
