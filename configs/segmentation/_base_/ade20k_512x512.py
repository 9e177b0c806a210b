# ADE20K (ADEChallengeData2016, 150 classes, label 0 = "other" ignored through
# reduce_zero_label) with the pipelines of the authors' release
# (`ZacharyMeng/PolaFormerPP`, downstream/segmentation/configs/_base_/datasets/ade20k_repeat.py:7-34):
# train: random resize to 0.5-2.0 of 2048x512 (keep ratio), random 512x512 crop
# (at most 75% one class), flip 0.5, photometric distortion, pad to 512x512
# (the data preprocessor); test: resize to 2048x512 (keep ratio), then resize
# (not pad) to a multiple of 32, whole image, single scale. `--tta` is their
# `--aug-test`: the same at 0.5-1.75 x 2048x512, with and without flip.
# CheckedADE20KDataset / CheckSegMapShape (polaformerpp.datasets.seg_checks,
# imported by ./default_runtime.py) are mmseg's ADE20KDataset / a label-size
# check that fail early and clearly on an empty split, a missing label map or a
# label map of the wrong size, so every pipeline is restated with the check after
# LoadAnnotations.
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
test_scale = (2048, 512)
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=test_scale, keep_ratio=True),
    dict(type='ResizeToMultiple', size_divisor=32),
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
            # mmseg 0.x MultiScaleFlipAug: ratio r scales the test scale, not the image
            [dict(type='Resize', scale=(int(test_scale[0] * r), int(test_scale[1] * r)), keep_ratio=True)
             for r in _base_.img_ratios],
            [dict(type='ResizeToMultiple', size_divisor=32)],
            [
                dict(type='RandomFlip', prob=0., direction='horizontal'),
                dict(type='RandomFlip', prob=1., direction='horizontal'),
            ],
            [dict(type='LoadAnnotations')],
            [dict(type='CheckSegMapShape')],
            [dict(type='PackSegInputs')],
        ]),
]
train_dataloader = dict(dataset=dict(type=dataset_type, pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(type=dataset_type, pipeline=test_pipeline))
test_dataloader = val_dataloader
