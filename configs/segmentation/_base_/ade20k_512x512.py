# ADE20K (ADEChallengeData2016, 150 classes, label 0 = "other" ignored through
# reduce_zero_label): mmseg's dataset settings with its standard 512x512
# augmentation (random resize to 0.5-2.0 of 2048x512, keep ratio; random 512x512
# crop, at most 75% one class; horizontal flip; photometric distortion). Test:
# resize to 2048x512 (keep ratio), whole image, single scale; `--tta`: scales
# 0.5-1.75 x flip. CheckedADE20KDataset / CheckSegMapShape
# (polaformerpp.datasets.seg_checks, imported by ./default_runtime.py) are
# mmseg's ADE20KDataset / a label-size check that fail early and clearly on an
# empty split, a missing label map or a label map of the wrong size, so every
# pipeline is restated with the check after LoadAnnotations.
_base_ = 'mmseg::_base_/datasets/ade20k.py'

dataset_type = 'CheckedADE20KDataset'
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='CheckSegMapShape'),
    dict(type='RandomResize', scale=(2048, 512), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=_base_.crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(2048, 512), keep_ratio=True),
    # labels are loaded after the resize: metrics are computed at the original size
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='CheckSegMapShape'),
    dict(type='PackSegInputs'),
]
tta_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(
        type='TestTimeAug',
        transforms=[
            [dict(type='Resize', scale_factor=r, keep_ratio=True) for r in _base_.img_ratios],
            [
                dict(type='RandomFlip', prob=0., direction='horizontal'),
                dict(type='RandomFlip', prob=1., direction='horizontal'),
            ],
            [dict(type='LoadAnnotations')],
            [dict(type='CheckSegMapShape')],
            [dict(type='PackSegInputs')],
        ]),
]
train_dataloader = dict(
    batch_size=2, dataset=dict(type=dataset_type, pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(type=dataset_type, pipeline=test_pipeline))
test_dataloader = val_dataloader
