# The published ImageNet-1K schedule: AdamW (0.9, 0.999), lr 5e-4 per 512 images
# (linear scaling; each config sets lr for its total batch), weight decay 0.05
# (none on norms, biases, layer scales and temperatures), grad clip 5.0,
# 20 linear warm-up epochs then cosine to eta_min over 300 epochs, model EMA 0.99982.
optim_wrapper = dict(
    optimizer=dict(type='AdamW', lr=5e-4, weight_decay=0.05, eps=1e-8, betas=(0.9, 0.999)),
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        flat_decay_mult=0.0,
        custom_keys={
            '.gamma1': dict(decay_mult=0.0),
            '.gamma2': dict(decay_mult=0.0),
            '.temp_same': dict(decay_mult=0.0),
            '.temp_opp': dict(decay_mult=0.0),
        }),
    clip_grad=dict(max_norm=5.0),
)

warmup_epochs = 20
max_epochs = 300
param_scheduler = [
    dict(
        type='LinearLR',
        start_factor=1e-3,
        by_epoch=True,
        begin=0,
        end=warmup_epochs,
        convert_to_iter_based=True),
    dict(
        type='CosineAnnealingLR',
        eta_min=1e-7,
        by_epoch=True,
        begin=warmup_epochs,
        end=max_epochs,
        T_max=max_epochs - warmup_epochs,
        convert_to_iter_based=True),
]

train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=1)
val_cfg = dict()
test_cfg = dict()

# EMA of the weights as published: decay 0.99982 (mmengine's momentum = 1 - decay).
custom_hooks = [
    dict(type='EMAHook', momentum=1 - 0.99982, priority='ABOVE_NORMAL', update_buffers=True)
]

# Set `--auto-scale-lr` to rescale lr when the total batch differs from the config's.
auto_scale_lr = dict(base_batch_size=512)
