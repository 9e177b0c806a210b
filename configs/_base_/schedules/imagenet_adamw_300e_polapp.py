# The authors' ImageNet-1K training defaults (polaformer++/config.py, run by main_ema.py); each
# arch's config sets what its cfgs/pola_b*.yaml overrides (configs/classification/README.md cites
# every value):
# AdamW (0.9, 0.999), eps 1e-8; lr 5e-4, warm-up start 5e-7 and final lr 5e-6 per 512 images
# (main_ema.py multiplies all three by the images per step / 512: each config sets lr for its own
# batch and gives the other two as ratios of it, so `--auto-scale-lr` scales them alike); weight
# decay 0.05 on every tensor except 1-D ones and biases (their optimizer's rule on their parameter
# shapes: their layer scales are (1, C, 1, 1) and their temperatures (1, h, 1, 2d), so both are
# decayed); grad clip 5.0; fp32; 20 warm-up epochs replacing the start of one 300-epoch cosine,
# no cool-down epochs; the lr is set after every optimizer step (the next step uses it); model EMA
# 0.99982 on weights and buffers after every optimizer step.
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

# timm's CosineLRScheduler as their lr_scheduler.py builds it (t_initial = cosine epochs, warmup_t,
# warmup_lr_init, lr_min, cycle_limit=1, no warm-up prefix, per iteration), trained for the cosine
# epochs plus the cool-down epochs at the final lr (polaformerpp.engine.WarmupCosineLR). A config
# that changes a value restates the whole list (mmengine replaces lists whole) and train_cfg.
param_scheduler = [
    dict(
        type='WarmupCosineLR',
        warmup=20,
        warmup_start_factor=5e-7 / 5e-4,
        eta_min_ratio=5e-6 / 5e-4,
        cooldown=0,
        lagged=True,
        by_epoch=True,
        begin=0,
        end=300 + 0,  # cosine epochs + cool-down epochs
        convert_to_iter_based=True),
]

train_cfg = dict(by_epoch=True, max_epochs=300 + 0, val_interval=1)
val_cfg = dict()
test_cfg = dict()

# EMA of the weights as published: decay 0.99982 (mmengine's momentum = 1 - decay),
# updated after every optimizer step, buffers included.
custom_hooks = [
    dict(type='EMAHook', momentum=1 - 0.99982, priority='ABOVE_NORMAL', update_buffers=True)
]

# Set `--auto-scale-lr` to rescale lr when the total batch differs from the config's.
auto_scale_lr = dict(base_batch_size=512)
