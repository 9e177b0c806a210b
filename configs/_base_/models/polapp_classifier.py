# PolaFormer++ ImageNet classifier: backbone (with its 1x1 conv + BN + Swish
# projection, out index 4) -> global average pooling -> linear classifier.
# The published recipe: label smoothing 0.1, Mixup 0.8, CutMix 1.0.
model = dict(
    type='ImageClassifier',
    backbone=dict(type='PolaFormerPP', arch='b0', out_indices=(4, )),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=2048,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        # the authors' classifier is a 1x1 conv: truncated normal std 0.02, zero bias
        init_cfg=dict(type='TruncNormal', layer='Linear', std=0.02, bias=0.),
    ),
    train_cfg=dict(augments=[
        dict(type='Mixup', alpha=0.8),
        dict(type='CutMix', alpha=1.0),
    ]),
)
