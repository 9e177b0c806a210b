# PolaFormer++-b3 + LightHam on ADE20K, the published setting: as
# polapp-b1_lightham_8xb2-160k_ade20k-512x512.py (512x512 crops, 8 GPUs x 2 images,
# 160k iterations, AdamW lr 6e-5 (heads x10), wd 0.01, 1500-iteration warm-up then
# poly (power 1.0), whole-image single-scale test) with the b3 arch.
#   bash tools/dist_train.sh configs/segmentation/polapp-b3_lightham_8xb2-160k_ade20k-512x512.py 8
_base_ = ['./polapp-b1_lightham_8xb2-160k_ade20k-512x512.py']

pretrained = 'checkpoints/polapp-b3_in1k.pth'

model = dict(
    backbone=dict(arch='b3', init_cfg=dict(checkpoint=pretrained)),  # drop path from the arch zoo
    # stages 2-4 (strides 8/16/32)
    decode_head=dict(in_channels=[128, 320, 512]))
