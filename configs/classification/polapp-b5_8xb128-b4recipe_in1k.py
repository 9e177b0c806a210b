# PolaFormer++-b5 on ImageNet-1K trained from random weights with b4's recipe (cfgs/pola_b4.yaml:
# 8 GPUs x 128 images, lr 1e-3 for 1024 images, 5 warm-up epochs, cosine to 1e-5 per 512 images over
# 300 epochs, 10 cool-down epochs, weight decay 0.05, clip 1.0). Not the authors' file: their
# pola_b5.yaml (polapp-b5_8xb64_in1k.py) holds fine-tuning values (lr 2e-5, weight decay 1e-8), and
# the release has no from-scratch b5 recipe; b4 is the closest model that has one. No result has
# been published or measured for this config.
_base_ = ['./polapp-b4_8xb128_in1k.py']

model = dict(
    backbone=dict(arch='b5'),  # drop path 0.55 and layer scale 1e-6 from the arch zoo
    head=dict(in_channels=2560),
)
