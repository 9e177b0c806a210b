# The demo job: PolaFormer++-b0 trained briefly on the CPU on the generated
# ImageNet-format shapes set (tools/misc/make_demo_data.py, 4 classes, 64 px),
# evaluated with mmpretrain's Accuracy. `make demo` runs it end to end.
_base_ = ['./polapp-b0_8xb256_in1k.py']

data_root = 'data/demo_in1k'
num_classes = 4
# the classes tools/misc/make_demo_data.py writes (meta/classes.txt)
classes = ('n00000000_disk', 'n00000001_square', 'n00000002_triangle', 'n00000003_cross')

model = dict(
    backbone=dict(drop_path_rate=0.0),
    head=dict(num_classes=num_classes),
    train_cfg=None,  # no Mixup/CutMix for a 160-image set
)
data_preprocessor = dict(num_classes=num_classes)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=64, crop_ratio_range=(0.6, 1.0), backend='pillow',
         interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=64, edge='short', backend='pillow', interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=64),
    dict(type='PackInputs'),
]

train_dataloader = dict(
    batch_size=32,
    num_workers=2,
    persistent_workers=False,
    pin_memory=False,
    dataset=dict(
        _delete_=True,
        type='CustomDataset',
        data_root=data_root,
        ann_file='meta/train.txt',
        data_prefix='train',
        classes=classes,
        pipeline=train_pipeline),
)
val_dataloader = dict(
    batch_size=40,
    num_workers=2,
    persistent_workers=False,
    pin_memory=False,
    dataset=dict(
        _delete_=True,
        type='CustomDataset',
        data_root=data_root,
        ann_file='meta/val.txt',
        data_prefix='val',
        classes=classes,
        pipeline=test_pipeline),
)
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_dataloader = val_dataloader
test_evaluator = val_evaluator

max_epochs = 30
optim_wrapper = dict(optimizer=dict(lr=1e-3))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=True, begin=0, end=2,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=2, end=max_epochs,
         T_max=max_epochs - 2, convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=max_epochs, val_interval=5)
auto_scale_lr = dict(base_batch_size=32)
custom_hooks = []  # EMA over a few hundred steps would stay near the initial weights

default_hooks = dict(
    logger=dict(interval=5),
    checkpoint=dict(interval=10, max_keep_ckpts=1, save_best='accuracy/top1', rule='greater'),
)
randomness = dict(seed=0)
