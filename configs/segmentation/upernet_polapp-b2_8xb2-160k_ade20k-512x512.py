# UperNet + auxiliary FCN over PolaFormer++-b2 on ADE20K: the common ADE20K
# backbone comparison (as Swin/ConvNeXt/PVT report it): 512x512 crops, 8 GPUs x
# 2 images, 160k iterations, AdamW lr 6e-5, wd 0.01, 1500-iteration warm-up then
# poly (power 1.0); whole-image single-scale test, `--tta` for multi-scale + flip.
#   bash tools/dist_train.sh configs/segmentation/upernet_polapp-b2_8xb2-160k_ade20k-512x512.py 8
_base_ = [
    '../_base_/segmentation/polapp_upernet.py',
    '../_base_/segmentation/ade20k_512x512.py',
    '../_base_/segmentation/schedule_adamw_160k.py',
    '../_base_/segmentation/default_runtime.py',
]
pretrained = 'checkpoints/polapp-b2_in1k.pth'  # ImageNet-1K classifier, weights under 'backbone.'

crop_size = (512, 512)
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(
        arch='b2',
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    decode_head=dict(in_channels=[64, 128, 256, 512], num_classes=150),
    auxiliary_head=dict(in_channels=256, num_classes=150))

train_dataloader = dict(batch_size=2)  # x 8 GPUs = 16 images per iteration
