# PolaFormer++-b1 + LightHam on ADE20K as the authors' release trains it
# (`ZacharyMeng/PolaFormerPP`, downstream/segmentation/configs/PolaPP/polapp_b1.py):
# 512x512 crops, 8 GPUs x 8 images = 64 per iteration, 160k iterations, AdamW
# lr 6e-5 (decode head x10), wd 0.01, poly with a 1500-iteration warm-up,
# mIoU every 8k iterations, whole-image single-scale test.
#   bash tools/dist_train.sh configs/segmentation/polapp-b1_lightham_8xb8-160k_ade20k-512x512.py 8
_base_ = [
    './_base_/polapp_lightham.py',
    './_base_/ade20k_512x512.py',
    './_base_/schedule_adamw_160k.py',
    './_base_/default_runtime.py',
]
# the ImageNet-1K classifier: the authors' release converted by
# tools/model_converters/polapp_official2mm.py (its raw 'model' weights, as their
# loader takes them) or this project's training; its weights sit under 'backbone.'.
# Set model.backbone.init_cfg=None to train from scratch.
pretrained = 'checkpoints/polapp-b1_in1k.pth'

model = dict(
    backbone=dict(
        arch='b1',  # drop path 0.1 from the arch zoo
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    decode_head=dict(in_channels=[64, 192, 384], num_classes=150))

# their custom_keys 'head' (lr x10): every decode-head parameter, its GroupNorms
# included, keeps the 0.01 decay (polapp_b1.py:50-55)
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={'head': dict(lr_mult=10.0)}))
train_dataloader = dict(batch_size=8)  # x 8 GPUs = 64 images per iteration (polapp_b1.py:41)
interval = 8000  # evaluation and checkpoint interval (polapp_b1.py:42-43)
train_cfg = dict(val_interval=interval)
default_hooks = dict(checkpoint=dict(interval=interval))
# `--auto-scale-lr` rescales lr when the total batch differs from 8 GPUs x 8 images
auto_scale_lr = dict(enable=False, base_batch_size=64)
