# Mask R-CNN + FPN, PolaFormer++-b2 backbone, COCO 2017, 1x schedule (12 epochs),
# 1333x800 single scale; 2 images/GPU x 8 GPUs (16 per iteration), AdamW lr 1e-4,
# weight decay 0.05, mixed precision.
#   bash tools/dist_train.sh configs/detection/mask-rcnn_polapp-b2_fpn_1x_coco.py 8
_base_ = [
    '../_base_/detection/mask-rcnn_polapp_fpn.py',
    '../_base_/detection/coco_instance.py',
    '../_base_/detection/schedule_adamw_1x.py',
    '../_base_/detection/default_runtime.py',
]

# ImageNet-1K classifier (tools/train.py work dir or tools/model_converters/polapp_official2mm.py);
# the backbone is stored under 'backbone.'. Override with
# --cfg-options model.backbone.init_cfg.checkpoint=PATH
pretrained = 'checkpoints/polapp-b2_in1k.pth'

model = dict(
    backbone=dict(
        arch='b2',
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    neck=dict(in_channels=[64, 128, 256, 512]))
