# PolaFormer++-b4 on ImageNet-1K as the authors train it: cfgs/pola_b4.yaml over the defaults of
# their config.py (values and file lines: configs/classification/README.md). Unlike b0-b3: 5 warm-up
# epochs from 1e-7, cosine to 1e-5 per 512 images, then 10 cool-down epochs at 1e-5 (310 in all),
# gradient clipping at norm 1.0.
_base_ = [
    '../_base_/models/polapp_classifier.py',
    '../_base_/datasets/imagenet_bs256_polapp_224.py',
    '../_base_/schedules/imagenet_adamw_300e_polapp.py',
    '../_base_/default_runtime.py',
]

model = dict(
    backbone=dict(arch='b4'),  # drop path 0.4 and layer scale 1, 1, 1e-6, 1e-6 from the arch zoo
    head=dict(in_channels=2048),
)

# 8 GPUs x 128 images (pola_b4.yaml sets no batch: config.py's 128); lr 5e-4 (pola_b4.yaml:10),
# warm-up start and final lr per 512 images x 1024 / 512; weight decay 0.05 (pola_b4.yaml:6);
# clip 1.0 (pola_b4.yaml:13)
train_dataloader = dict(batch_size=128)
optim_wrapper = dict(optimizer=dict(lr=5e-4 * 1024 / 512, weight_decay=0.05), clip_grad=dict(max_norm=1.0))
auto_scale_lr = dict(base_batch_size=1024)

# 300 cosine epochs (pola_b4.yaml:7) of which 5 warm up (:8) from 1e-7 (:11), cosine to 1e-5 (:12),
# 10 cool-down epochs (:9)
param_scheduler = [
    dict(type='WarmupCosineLR', warmup=5, warmup_start_factor=1e-7 / 5e-4, eta_min_ratio=1e-5 / 5e-4,
         cooldown=10, lagged=True, by_epoch=True, begin=0, end=300 + 10, convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=300 + 10)
