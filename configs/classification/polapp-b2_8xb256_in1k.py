# PolaFormer++-b2 on ImageNet-1K: the published 300-epoch recipe, 8 GPUs x 256 images.
# As b0 with the arch changed (drop path from the arch zoo).
_base_ = ['./polapp-b0_8xb256_in1k.py']

model = dict(backbone=dict(arch='b2'))
