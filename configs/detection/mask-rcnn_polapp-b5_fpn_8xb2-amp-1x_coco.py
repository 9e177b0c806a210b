# Mask R-CNN + FPN, PolaFormer++-b5 backbone, COCO 2017, 1x schedule (12 epochs),
# 1333x800 single scale; as mask-rcnn_polapp-b2_fpn_8xb2-amp-1x_coco.py (2 images/GPU x
# 8 GPUs, AdamW lr 1e-4, weight decay 0.05, mixed precision) with the b5 arch
# (the authors' release, downstream/detection/configs/PolaPP/maskrcnn_b5_1x.py).
#   bash tools/dist_train.sh configs/detection/mask-rcnn_polapp-b5_fpn_8xb2-amp-1x_coco.py 8
_base_ = ['./mask-rcnn_polapp-b2_fpn_8xb2-amp-1x_coco.py']

pretrained = 'checkpoints/polapp-b5_in1k.pth'

model = dict(
    backbone=dict(arch='b5', init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 448, 640]))
