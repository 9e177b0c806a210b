# Mask R-CNN + FPN, PolaFormer++-b3 backbone, COCO 2017, 1x schedule (12 epochs),
# 1333x800 single scale; as mask-rcnn_polapp-b2_fpn_8xb2-amp-1x_coco.py (2 images/GPU x
# 8 GPUs, AdamW lr 1e-4, weight decay 0.05, mixed precision) with the b3 arch
# (the authors' release, downstream/detection/configs/PolaPP/maskrcnn_b3_1x.py).
#   bash tools/dist_train.sh configs/detection/mask-rcnn_polapp-b3_fpn_8xb2-amp-1x_coco.py 8
_base_ = ['./mask-rcnn_polapp-b2_fpn_8xb2-amp-1x_coco.py']

pretrained = 'checkpoints/polapp-b3_in1k.pth'

model = dict(
    backbone=dict(arch='b3', init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[64, 128, 320, 512]))
