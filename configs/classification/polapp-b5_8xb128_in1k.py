# PolaFormer++-b5 on ImageNet-1K: the published 300-epoch recipe, 8 GPUs x 128 images
# (b5's per-GPU batch is not published; 128 as for b3/b4). Same schedule as b4
# (lr 1e-3 for 1024 images, cosine to 1e-5, i.e. 5e-6 per 512 images).
_base_ = ['./polapp-b4_8xb128_in1k.py']

model = dict(
    backbone=dict(arch='b5'),  # drop path and layer scale from the arch zoo
    head=dict(in_channels=2560),
)
