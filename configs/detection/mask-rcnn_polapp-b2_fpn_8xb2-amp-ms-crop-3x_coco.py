# Mask R-CNN + FPN, PolaFormer++-b2 backbone, COCO 2017, 3x schedule (36 epochs,
# lr steps at 27/33) with multi-scale training: short side 480-800 (long side
# <= 1333), or the DETR-style branch (resize to 400-600, random crop 384-600,
# resize to 480-800); 2 images/GPU x 8 GPUs (16 per iteration), AdamW lr 1e-4,
# weight decay 0.05, mixed precision: the authors' release (`ZacharyMeng/PolaFormerPP`,
# downstream/detection/configs/PolaPP/maskrcnn_b2_3x.py).
#   bash tools/dist_train.sh configs/detection/mask-rcnn_polapp-b2_fpn_8xb2-amp-ms-crop-3x_coco.py 8
_base_ = ['./mask-rcnn_polapp-b2_fpn_8xb2-amp-1x_coco.py']

# the published 3x schedule: 36 epochs, lr x0.1 at epochs 27 and 33, otherwise as 1x
max_epochs = 36
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    {{_base_.warmup}},
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[27, 33], gamma=0.1),
]

# (width, height) scales: keep_ratio resizes the short side to the smaller
# value unless the long side would exceed 1333. The flip comes first and the two
# branches are drawn with equal probability, as in the authors' AutoAugment list
# (mmdet 2.x's AutoAugment picks a policy uniformly, as RandomChoice does).
multi_scales = [(1333, s) for s in range(480, 801, 32)]
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args={{_base_.backend_args}}),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(
        type='RandomChoice',
        transforms=[
            [dict(type='RandomChoiceResize', scales=multi_scales, keep_ratio=True)],
            [
                dict(type='RandomChoiceResize', scales=[(1333, 400), (1333, 500), (1333, 600)],
                     keep_ratio=True),
                dict(type='RandomCrop', crop_type='absolute_range', crop_size=(384, 600),
                     allow_negative_crop=True),
                dict(type='RandomChoiceResize', scales=multi_scales, keep_ratio=True),
            ],
        ]),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
