# mmseg's 160k-iteration loop (mIoU every 16k iterations) with the published
# optimisation: AdamW (0.9, 0.999), lr 6e-5, weight decay 0.01 (none on norm
# layers, layer scales gamma1/gamma2 and the attention temperatures),
# 1500-iteration linear warm-up then poly decay (power 1.0) to 0; a checkpoint
# every 16k iterations, the best mIoU kept. The configs add a 10x lr on the
# heads where the recipe has it.
_base_ = 'mmseg::_base_/schedules/schedule_160k.py'

# mmseg's schedule names its SGD optimizer at the top level too; the runner
# builds only optim_wrapper
optimizer = None
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        custom_keys={
            '.gamma1': dict(decay_mult=0.0),
            '.gamma2': dict(decay_mult=0.0),
            '.temp_same': dict(decay_mult=0.0),
            '.temp_opp': dict(decay_mult=0.0),
        }),
)

max_iters = 160000
warmup_iters = 1500
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=warmup_iters),
    dict(type='PolyLR', power=1.0, eta_min=0.0, by_epoch=False, begin=warmup_iters, end=max_iters),
]

default_hooks = dict(
    checkpoint=dict(max_keep_ckpts=3, save_best='mIoU', rule='greater'))

# `--auto-scale-lr` rescales lr when the total batch differs from 8 GPUs x 2 images
auto_scale_lr = dict(enable=False, base_batch_size=16)
