# PolaFormer++-b4 on ImageNet-1K: the published 300-epoch recipe, 8 GPUs x 128 images.
# As b3 with the arch changed (drop path and layer scale from the arch zoo) and the
# cosine schedule ending at 5e-6, as for the large models.
_base_ = ['./polapp-b3_8xb128_in1k.py']

model = dict(backbone=dict(arch='b4'))

param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=20,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=5e-6, by_epoch=True, begin=20, end=300,
         T_max=280, convert_to_iter_based=True),
]
