# The authors' ImageNet-1K schedule: AdamW (0.9, 0.999), eps 1e-8, lr 5e-4 per 512
# images (each config sets lr for its total batch; the warm-up start and the final lr
# are ratios of it, so they scale with it as the authors' linear scaling scales all
# three), weight decay 0.05 on every tensor except 1-D ones and biases (their
# optimizer's rule on their parameter shapes: their layer scales are (1, C, 1, 1) and
# their temperatures (1, h, 1, 2d), so both are decayed), grad clip 5.0, fp32,
# 20 warm-up epochs from 1e-3 x lr replacing the start of one 300-epoch cosine to
# 2e-4 x lr (1e-7 per 512 images; b4/b5 override it), stepped every iteration;
# model EMA 0.99982 on weights and buffers.
optim_wrapper = dict(
    optimizer=dict(type='AdamW', lr=5e-4, weight_decay=0.05, eps=1e-8, betas=(0.9, 0.999)),
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        flat_decay_mult=0.0,
        # ours are 1-D (C,): decayed as the authors' (1, C, 1, 1) layer scales are
        custom_keys={
            '.gamma1': dict(decay_mult=1.0),
            '.gamma2': dict(decay_mult=1.0),
        }),
    clip_grad=dict(max_norm=5.0),
)

warmup_epochs = 20
max_epochs = 300
# timm's CosineLRScheduler as the authors' Swin-style code builds it (no warm-up prefix,
# stepped every iteration): one cosine over all 300 epochs whose first 20 epochs are
# replaced by the linear warm-up (see polaformerpp.engine.WarmupCosineLR)
param_scheduler = [
    dict(
        type='WarmupCosineLR',
        warmup=warmup_epochs,
        warmup_start_factor=5e-7 / 5e-4,  # warm-up lr 5e-7 per 512 images
        eta_min_ratio=1e-7 / 5e-4,  # min lr 1e-7 per 512 images
        by_epoch=True,
        begin=0,
        end=max_epochs,
        convert_to_iter_based=True),
]

train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=1)
val_cfg = dict()
test_cfg = dict()

# EMA of the weights as published: decay 0.99982 (mmengine's momentum = 1 - decay),
# updated after every optimizer step, buffers included.
custom_hooks = [
    dict(type='EMAHook', momentum=1 - 0.99982, priority='ABOVE_NORMAL', update_buffers=True)
]

# Set `--auto-scale-lr` to rescale lr when the total batch differs from the config's.
auto_scale_lr = dict(base_batch_size=512)
