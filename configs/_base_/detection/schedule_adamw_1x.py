# The published COCO 1x schedule for PolaFormer++ backbones: 12 epochs, lr x0.1
# at epochs 8 and 11, 500-iteration linear warm-up, AdamW lr 1e-4 (0.9, 0.999),
# weight decay 0.05 (RetinaNet configs set 1e-4), no decay on norms, layer
# scales (gamma1/gamma2) and attention temperatures, mixed precision.
# lr 1e-4 is for 16 images per iteration (2 images/GPU x 8 GPUs).
max_epochs = 12
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=1)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11],
         gamma=0.1),
]

optim_wrapper = dict(
    type='AmpOptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        custom_keys={
            '.gamma1': dict(decay_mult=0.0),
            '.gamma2': dict(decay_mult=0.0),
            '.temp_same': dict(decay_mult=0.0),
            '.temp_opp': dict(decay_mult=0.0),
        }),
)

# `--auto-scale-lr` rescales lr when the total batch is not 16.
auto_scale_lr = dict(enable=False, base_batch_size=16)
