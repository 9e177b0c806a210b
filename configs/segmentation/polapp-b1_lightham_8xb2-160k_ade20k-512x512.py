# PolaFormer++-b1 + LightHam on ADE20K, the published setting: 512x512 crops,
# 8 GPUs x 2 images, 160k iterations, AdamW lr 6e-5 (heads x10), wd 0.01,
# 1500-iteration warm-up then poly (power 1.0), whole-image single-scale test.
#   bash tools/dist_train.sh configs/segmentation/polapp-b1_lightham_8xb2-160k_ade20k-512x512.py 8
_base_ = [
    './_base_/polapp_lightham.py',
    './_base_/ade20k_512x512.py',
    './_base_/schedule_adamw_160k.py',
    './_base_/default_runtime.py',
]
# the ImageNet-1K classifier (this project's training, or the authors' release
# converted by tools/model_converters/polapp_official2mm.py); its weights sit under
# 'backbone.'. Set model.backbone.init_cfg=None to train from scratch.
pretrained = 'checkpoints/polapp-b1_in1k.pth'

model = dict(
    backbone=dict(
        arch='b1',  # drop path from the arch zoo
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    decode_head=dict(in_channels=[64, 192, 384], num_classes=150))

# heads at 10x lr (a matching custom key takes precedence over norm_decay_mult, so the
# heads' GroupNorms keep the 0.01 decay, as in SegNeXt's recipe)
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={'head': dict(lr_mult=10.0)}))
train_dataloader = dict(batch_size=2)  # x 8 GPUs = 16 images per iteration
