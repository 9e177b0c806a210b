# RetinaNet + FPN, PolaFormer++-b2 backbone, COCO 2017, 1x schedule (12 epochs),
# 1333x800 single scale; 2 images/GPU x 8 GPUs (16 per iteration), AdamW lr 1e-4,
# weight decay 1e-4 on every parameter (no parameter-wise rules), mixed precision
# (static loss scale 512): the authors' release (`ZacharyMeng/PolaFormerPP`,
# downstream/detection/configs/PolaPP/retinanet_b2_1x.py).
#   bash tools/dist_train.sh configs/detection/retinanet_polapp-b2_fpn_8xb2-amp-1x_coco.py 8
# mmdet's RetinaNet with its ResNet-50 replaced by the PolaFormer++ backbone.
#
# The pyramid starts at stride 8 with two extra levels convolved from the
# stride-32 backbone output (P3-P7; the authors: `start_level=1,
# add_extra_convs='on_input'` over the four stage outputs, with
# find_unused_parameters for the unused stride-4 output norm). The backbone
# returns only the three stage outputs the FPN reads (out_indices 1-3, strides
# 8/16/32), so the FPN's start_level is 0 over them: the same network, without
# the parameters that never receive a gradient.
_base_ = [
    'mmdet::_base_/models/retinanet_r50_fpn.py',
    './_base_/coco_detection.py',
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
        out_indices=(1, 2, 3),
        attn_types=('linear', 'linear', 'softmax', 'softmax'),
        frozen_stages=-1,
        norm_eval=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    # the FPN reads stages 2-4 (strides 8/16/32): P3-P5 plus P6-P7 convolved from C5
    neck=dict(in_channels=[128, 256, 512], start_level=0))

# the authors' RetinaNet optimizer: weight decay 1e-4 on every parameter, norms included
optim_wrapper = dict(optimizer=dict(weight_decay=1e-4), paramwise_cfg=None)
