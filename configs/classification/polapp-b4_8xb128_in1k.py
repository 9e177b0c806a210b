# PolaFormer++-b4 on ImageNet-1K: the published 300-epoch recipe, 8 GPUs x 128 images.
_base_ = [
    '../_base_/models/polapp_classifier.py',
    '../_base_/datasets/imagenet_bs256_polapp_224.py',
    '../_base_/schedules/imagenet_adamw_300e_polapp.py',
    '../_base_/default_runtime.py',
]

model = dict(
    backbone=dict(arch='b4'),  # drop path and layer scale from the arch zoo
    head=dict(in_channels=2048),
)

train_dataloader = dict(batch_size=128)

# lr 5e-4 per 512 images -> 0.001 for 1024
optim_wrapper = dict(optimizer=dict(lr=0.001))
auto_scale_lr = dict(base_batch_size=1024)

# cosine to 5e-6 for the large models
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=20,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=5e-6, by_epoch=True, begin=20, end=300,
         T_max=280, convert_to_iter_based=True),
]
