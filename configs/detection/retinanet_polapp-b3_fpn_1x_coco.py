# RetinaNet + FPN, PolaFormer++-b3 backbone, COCO 2017, 1x schedule (12 epochs),
# 1333x800 single scale; 2 images/GPU x 8 GPUs (16 per iteration), AdamW lr 1e-4,
# weight decay 1e-4, mixed precision.
#   bash tools/dist_train.sh configs/detection/retinanet_polapp-b3_fpn_1x_coco.py 8
_base_ = [
    '../_base_/detection/retinanet_polapp_fpn.py',
    '../_base_/detection/coco_detection.py',
    '../_base_/detection/schedule_adamw_1x.py',
    '../_base_/detection/default_runtime.py',
]

# ImageNet-1K classifier (tools/train.py work dir or tools/model_converters/polapp_official2mm.py);
# the backbone is stored under 'backbone.'. Override with
# --cfg-options model.backbone.init_cfg.checkpoint=PATH
pretrained = 'checkpoints/polapp-b3_in1k.pth'

model = dict(
    backbone=dict(
        arch='b3',
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    # the FPN reads stages 2-4 (strides 8/16/32): P3-P5 plus P6-P7 convolved from C5
    neck=dict(in_channels=[128, 320, 512]))

optim_wrapper = dict(optimizer=dict(weight_decay=1e-4))
