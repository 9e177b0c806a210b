# The published COCO 1x schedule for PolaFormer++ backbones: mmdet's 1x loop
# (12 epochs, 500-iteration linear warm-up, lr x0.1 at epochs 8 and 11) with
# AdamW lr 1e-4 (0.9, 0.999), weight decay 0.05 (RetinaNet configs set 1e-4),
# no decay on norms, layer scales (gamma1/gamma2) and attention temperatures,
# mixed precision. lr 1e-4 is for 16 images per iteration (2 images/GPU x 8
# GPUs); `--auto-scale-lr` rescales it for another total batch (mmdet's
# auto_scale_lr, base batch 16).
_base_ = 'mmdet::_base_/schedules/schedule_1x.py'

max_epochs = 12

optim_wrapper = dict(
    _delete_=True,
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
