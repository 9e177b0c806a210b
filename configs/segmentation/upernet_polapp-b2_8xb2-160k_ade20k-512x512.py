# UperNet + auxiliary FCN over PolaFormer++-b2 on ADE20K: the common ADE20K
# backbone comparison. The authors' release has no UperNet config; this one
# follows Swin's UperNet recipe (8 GPUs x 2 images, 160k iterations, AdamW lr
# 6e-5, wd 0.01 with none on norms, poly with a 1500-iteration warm-up, no head
# lr multiplier, mIoU every 16k iterations) with the authors' ADE20K pipelines,
# test protocol and backbone treatment (BatchNorms in eval mode, their decay rule).
#   bash tools/dist_train.sh configs/segmentation/upernet_polapp-b2_8xb2-160k_ade20k-512x512.py 8
# mmseg's UperNet (PPM on stage 4 + FPN over stages 1-4, auxiliary FCN head on
# stage 3 with loss weight 0.4, SyncBN in the heads: BN on a machine without CUDA,
# by the tools) with its ResNet-50 replaced by the PolaFormer++ backbone.
_base_ = [
    'mmseg::_base_/models/upernet_r50.py',
    './_base_/ade20k_512x512.py',
    './_base_/schedule_adamw_160k.py',
    './_base_/default_runtime.py',
]
pretrained = 'checkpoints/polapp-b2_in1k.pth'  # ImageNet-1K classifier, weights under 'backbone.'

crop_size = (512, 512)
data_preprocessor = dict(size=crop_size)  # test images are resized to a multiple of 32 by the pipeline
model = dict(
    data_preprocessor=data_preprocessor,
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='PolaFormerPP',
        arch='b2',
        out_indices=(0, 1, 2, 3),
        attn_types=('linear', 'linear', 'softmax', 'softmax'),
        frozen_stages=-1,
        norm_eval=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    decode_head=dict(in_channels=[64, 128, 256, 512], num_classes=150),
    auxiliary_head=dict(in_channels=256, num_classes=150))

train_dataloader = dict(batch_size=2)  # x 8 GPUs = 16 images per iteration
# `--auto-scale-lr` rescales lr when the total batch differs from 8 GPUs x 2 images
auto_scale_lr = dict(enable=False, base_batch_size=16)
