# PolaFormer++ backbone + LightHam decode head (SegNeXt's Hamburger: matrix
# decomposition by NMF) as in the authors' release (`ZacharyMeng/PolaFormerPP`,
# downstream/segmentation/configs/PolaPP/polapp_b2.py:9-39): head on the outputs
# of stages 2-4 (strides 8/16/32), channels 512, ham channels 512, NMF with MD_R 16
# (mmseg's other NMF defaults), GroupNorm(32), dropout 0.1, align_corners False,
# whole-image inference; the backbone's BatchNorms in eval mode while training
# (their PolaPP's norm_eval=True, mmseg/models/backbones/PolaPP.py:431,531-538).
# The backbone returns only stages 2-4 (out_indices 1-3: every parameter takes
# part in the loss, so DDP needs no find_unused_parameters; theirs returns all
# four and sets it); in_index selects all three. mmseg 1.2.2 has LightHam only
# inside its SegNeXt configs, not as a model base, so the model is stated here.
data_preprocessor = dict(
    type='SegDataPreProcessor',
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    bgr_to_rgb=True,
    pad_val=0,
    seg_pad_val=255,
    size=(512, 512))  # test images are resized to a multiple of 32 by the pipeline
ham_norm_cfg = dict(type='GN', num_groups=32, requires_grad=True)
model = dict(
    type='EncoderDecoder',
    data_preprocessor=data_preprocessor,
    pretrained=None,
    backbone=dict(
        type='PolaFormerPP',
        arch='b1',
        out_indices=(1, 2, 3),
        attn_types=('linear', 'linear', 'softmax', 'softmax'),
        frozen_stages=-1,
        norm_eval=True),
    decode_head=dict(
        type='LightHamHead',
        in_channels=[64, 192, 384],
        in_index=[0, 1, 2],
        channels=512,
        ham_channels=512,
        dropout_ratio=0.1,
        num_classes=150,
        norm_cfg=ham_norm_cfg,
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
        ham_kwargs=dict(MD_S=1, MD_R=16, train_steps=6, eval_steps=7, inv_t=100, rand_init=True)),
    train_cfg=dict(),
    test_cfg=dict(mode='whole'))
