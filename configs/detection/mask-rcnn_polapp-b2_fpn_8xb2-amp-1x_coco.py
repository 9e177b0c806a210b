# Mask R-CNN + FPN, PolaFormer++-b2 backbone, COCO 2017, 1x schedule (12 epochs),
# 1333x800 single scale; 2 images/GPU x 8 GPUs (16 per iteration), AdamW lr 1e-4,
# weight decay 0.05 (none on the parameters named 'norm' by the authors), mixed
# precision (static loss scale 512): the authors' release
# (`ZacharyMeng/PolaFormerPP`, downstream/detection/configs/PolaPP/maskrcnn_b2_1x.py).
#   bash tools/dist_train.sh configs/detection/mask-rcnn_polapp-b2_fpn_8xb2-amp-1x_coco.py 8
# mmdet's Mask R-CNN with its ResNet-50 replaced by the PolaFormer++ backbone, which
# returns its four stage outputs (strides 4/8/16/32, each through a LayerNorm).
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    './_base_/coco_instance.py',
    './_base_/schedule_adamw_1x.py',
    './_base_/default_runtime.py',
]

# ImageNet-1K classifier, its raw (not EMA) weights as the authors load them
# (tools/model_converters/polapp_official2mm.py without --ema); the backbone is stored
# under 'backbone.'. Override with --cfg-options model.backbone.init_cfg.checkpoint=PATH
pretrained = 'checkpoints/polapp-b2_in1k.pth'

model = dict(
    backbone=dict(
        _delete_=True,
        type='PolaFormerPP',
        arch='b2',
        out_indices=(0, 1, 2, 3),
        attn_types=('linear', 'linear', 'softmax', 'softmax'),
        # nothing frozen, BatchNorms in training mode: the authors' backbone takes
        # norm_eval but has no train() override that would use it
        frozen_stages=-1,
        norm_eval=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    neck=dict(in_channels=[64, 128, 256, 512]))
