# PolaFormer++-b2 on ImageNet-1K: cfgs/pola_b2.yaml, the same values as pola_b0.yaml (8 GPUs x 256
# images, 300 epochs, final lr 1e-7 per 512 images): b0's config with the arch changed.
_base_ = ['./polapp-b0_8xb256_in1k.py']

model = dict(backbone=dict(arch='b2'))  # drop path 0.1 from the arch zoo
