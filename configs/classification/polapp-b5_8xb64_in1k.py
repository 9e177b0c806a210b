# PolaFormer++-b5 on ImageNet-1K as the authors' release gives it: cfgs/pola_b5.yaml over the
# defaults of their config.py (values and file lines: configs/classification/README.md): 8 GPUs x 64
# images, lr 2e-5, 1 warm-up epoch from 5e-7, cosine to 5e-6 over 300 epochs, 5 cool-down epochs
# (305 in all), weight decay 1e-8, no gradient clipping. The values read like fine-tuning, but the
# release gives this file for training from scratch (its README points to pretrain.sh, which loads
# no checkpoint), so they are kept as published. polapp-b5_8xb128-b4recipe_in1k.py trains b5 from
# random weights with b4's recipe instead.
_base_ = [
    '../_base_/models/polapp_classifier.py',
    '../_base_/datasets/imagenet_bs256_polapp_224.py',
    '../_base_/schedules/imagenet_adamw_300e_polapp.py',
    '../_base_/default_runtime.py',
]

model = dict(
    backbone=dict(arch='b5'),  # drop path 0.55 and layer scale 1e-6 from the arch zoo
    head=dict(in_channels=2560),
)

# 8 GPUs x 64 images (pola_b5.yaml:15): 512 per step, so the lr values are the files' own; lr 2e-5
# (:10), weight decay 1e-8 (:6), no clipping (:12)
train_dataloader = dict(batch_size=64)
optim_wrapper = dict(optimizer=dict(lr=2e-5 * 512 / 512, weight_decay=1e-8), clip_grad=None)
auto_scale_lr = dict(base_batch_size=512)

# 300 cosine epochs (pola_b5.yaml:7) of which 1 warms up (:8) from config.py's 5e-7, cosine to 5e-6
# (:11), 5 cool-down epochs (:9)
param_scheduler = [
    dict(type='WarmupCosineLR', warmup=1, warmup_start_factor=5e-7 / 2e-5, eta_min_ratio=5e-6 / 2e-5,
         cooldown=5, lagged=True, by_epoch=True, begin=0, end=300 + 5, convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=300 + 5)
