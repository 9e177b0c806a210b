# PolaFormer++-b1 on ImageNet-1K: the published 300-epoch recipe, 8 GPUs x 256 images.
_base_ = [
    '../_base_/models/polapp_classifier.py',
    '../_base_/datasets/imagenet_bs256_polapp_224.py',
    '../_base_/schedules/imagenet_adamw_300e_polapp.py',
    '../_base_/default_runtime.py',
]

model = dict(
    backbone=dict(arch='b1'),  # drop path from the arch zoo
    head=dict(in_channels=2048),
)

# lr 5e-4 per 512 images -> 0.002 for 2048
optim_wrapper = dict(optimizer=dict(lr=0.002))
auto_scale_lr = dict(base_batch_size=2048)
