# PolaFormer++-b4 on ImageNet-1K: the published 300-epoch recipe, 8 GPUs x 128 images.
# As b3 with the arch changed (drop path and layer scale from the arch zoo) and the
# cosine schedule ending at 5e-6 per 512 images (1e-2 x lr), as for the large models.
_base_ = ['./polapp-b3_8xb128_in1k.py']

model = dict(backbone=dict(arch='b4'))

# the base's schedule with the min lr of the large models (a list is replaced whole)
param_scheduler = [
    dict(type='WarmupCosineLR', warmup=20, warmup_start_factor=5e-7 / 5e-4, eta_min_ratio=5e-6 / 5e-4,
         by_epoch=True, begin=0, end=300, convert_to_iter_based=True),
]
