# The authors' COCO 1x recipe (Mask R-CNN; the RetinaNet configs change the weight
# decay and drop the parameter-wise rules), translated from mmdet 2.x: mmdet's 1x loop
# (12 epochs, 500-iteration linear warm-up from 0.001, lr x0.1 at epochs 8 and 11,
# no gradient clipping) with AdamW lr 1e-4 (0.9, 0.999), weight decay 0.05, and
# mixed precision with a static loss scale of 512 (mmcv's `fp16 = dict()`). lr 1e-4 is
# for 16 images per iteration (2 images/GPU x 8 GPUs); `--auto-scale-lr` rescales it
# for another total batch (mmdet's auto_scale_lr, base batch 16).
_base_ = 'mmdet::_base_/schedules/schedule_1x.py'

max_epochs = 12

# mmcv's linear warm-up: lr x (0.001 + 0.999 * i / 500) at iteration i < 500, the full lr
# from iteration 500. mmengine's LinearLR reaches its end factor at iteration end - 1, so
# the same curve ends at 501 (mmdet 3.x's schedule_1x, end=500, is one iteration short).
warmup = dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=501)
param_scheduler = [
    warmup,
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11], gamma=0.1),
]

optim_wrapper = dict(
    _delete_=True,
    type='AmpOptimWrapper',
    loss_scale=512.0,
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    # The authors exempt every parameter whose name contains 'norm'. In their module
    # tree those are the blocks' LayerNorms (`norm1.norm`, `norm2.norm`), the output
    # LayerNorms (`extra_norms.i.norm`) and the downsampling BatchNorms
    # (`downsample.norm`), but not the stem BatchNorms (`patch_embed.proj.1`...), the
    # layer scales or the temperatures. Here the same tensors are `norm1`, `norm2`,
    # `norm0`-`norm3` and `downsample.bn` (the stem's BatchNorms are `stem.i.bn`).
    paramwise_cfg=dict(custom_keys={
        'norm': dict(decay_mult=0.0),
        'downsample.bn': dict(decay_mult=0.0),
    }),
)
