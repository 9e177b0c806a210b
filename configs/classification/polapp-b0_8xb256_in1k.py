# PolaFormer++-b0 on ImageNet-1K as the authors train it: polaformer++/cfgs/pola_b0.yaml over the
# defaults of their config.py, run by main_ema.py on 8 GPUs (pretrain.sh). The values and the file
# lines they come from: configs/classification/README.md.
_base_ = [
    '../_base_/models/polapp_classifier.py',
    '../_base_/datasets/imagenet_bs256_polapp_224.py',
    '../_base_/schedules/imagenet_adamw_300e_polapp.py',
    '../_base_/default_runtime.py',
]

model = dict(
    backbone=dict(arch='b0'),  # drop path 0.1 from the arch zoo
    head=dict(in_channels=2048),
)

# 8 GPUs x 256 images (pola_b0.yaml:6); lr, warm-up start and final lr per 512 images x 2048 / 512
train_dataloader = dict(batch_size=256)
optim_wrapper = dict(optimizer=dict(lr=5e-4 * 2048 / 512))
auto_scale_lr = dict(base_batch_size=2048)

# 300 epochs (pola_b0.yaml:8), 20 warm-up epochs from 5e-7, cosine to 1e-7 (pola_b0.yaml:9), no cool-down
param_scheduler = [
    dict(type='WarmupCosineLR', warmup=20, warmup_start_factor=5e-7 / 5e-4, eta_min_ratio=1e-7 / 5e-4,
         cooldown=0, lagged=True, by_epoch=True, begin=0, end=300 + 0, convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=300 + 0)
