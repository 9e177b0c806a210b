# PolaFormer++-b3 + LightHam on ADE20K, as the authors' release trains it
# (`ZacharyMeng/PolaFormerPP`, downstream/segmentation/configs/PolaPP/polapp_b3.py):
# polapp-b1_lightham_8xb8-160k_ade20k-512x512.py (8 GPUs x 8 images, 160k iterations)
# with the b3 arch.
#   bash tools/dist_train.sh configs/segmentation/polapp-b3_lightham_8xb8-160k_ade20k-512x512.py 8
_base_ = ['./polapp-b1_lightham_8xb8-160k_ade20k-512x512.py']

pretrained = 'checkpoints/polapp-b3_in1k.pth'

model = dict(
    backbone=dict(arch='b3', init_cfg=dict(checkpoint=pretrained)),  # drop path 0.15 from the arch zoo
    # stages 2-4 (strides 8/16/32)
    decode_head=dict(in_channels=[128, 320, 512]))
