# PolaFormer++-b2 + LightHam on ADE20K, as the authors' release trains it
# (`ZacharyMeng/PolaFormerPP`, downstream/segmentation/configs/PolaPP/polapp_b2.py):
# polapp-b1_lightham_8xb8-160k_ade20k-512x512.py (8 GPUs x 8 images, 160k iterations)
# with the b2 arch.
#   bash tools/dist_train.sh configs/segmentation/polapp-b2_lightham_8xb8-160k_ade20k-512x512.py 8
_base_ = ['./polapp-b1_lightham_8xb8-160k_ade20k-512x512.py']

pretrained = 'checkpoints/polapp-b2_in1k.pth'

model = dict(
    backbone=dict(arch='b2', init_cfg=dict(checkpoint=pretrained)),  # drop path 0.1 from the arch zoo
    # stages 2-4 (strides 8/16/32)
    decode_head=dict(in_channels=[128, 256, 512]))
