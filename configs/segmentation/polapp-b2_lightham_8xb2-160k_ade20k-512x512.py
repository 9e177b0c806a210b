# PolaFormer++-b2 + LightHam on ADE20K, the published setting: as
# polapp-b1_lightham_8xb2-160k_ade20k-512x512.py (512x512 crops, 8 GPUs x 2 images,
# 160k iterations, AdamW lr 6e-5 (heads x10), wd 0.01, 1500-iteration warm-up then
# poly (power 1.0), whole-image single-scale test) with the b2 arch.
#   bash tools/dist_train.sh configs/segmentation/polapp-b2_lightham_8xb2-160k_ade20k-512x512.py 8
_base_ = ['./polapp-b1_lightham_8xb2-160k_ade20k-512x512.py']

pretrained = 'checkpoints/polapp-b2_in1k.pth'

model = dict(
    backbone=dict(arch='b2', init_cfg=dict(checkpoint=pretrained)),  # drop path from the arch zoo
    # stages 2-4 (strides 8/16/32)
    decode_head=dict(in_channels=[128, 256, 512]))
