# mmseg's 160k-iteration loop with the optimisation of the authors' release
# (`ZacharyMeng/PolaFormerPP`, downstream/segmentation/configs/PolaPP/polapp_b2.py:43-61):
# AdamW (0.9, 0.999), lr 6e-5, weight decay 0.01 on every parameter except
# those whose name in the authors' module tree contains 'norm' (the blocks'
# LayerNorms, the downsampling BatchNorms, the output LayerNorms; the stem's
# BatchNorms, layer scales, temperatures and biases are decayed), no gradient
# clipping, fp32; lr: mmcv's poly (power 1.0, min 0) over all 160k iterations,
# times a linear warm-up factor from 1e-6 to 1 over the first 1500.
_base_ = 'mmseg::_base_/schedules/schedule_160k.py'

# mmseg's schedule names its SGD optimizer at the top level too; the runner
# builds only optim_wrapper
optimizer = None
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    # the authors' 'norm' key in this project's names: their `*.norm{1,2}.norm`,
    # `extra_norms.*` are `.norm*` here, their `downsample.norm` is `downsample.bn`
    # (their 'pos_block' key matches no parameter of their model)
    paramwise_cfg=dict(custom_keys={
        '.norm': dict(decay_mult=0.0),
        'downsample.bn': dict(decay_mult=0.0),
    }),
)

max_iters = 160000
warmup_iters = 1500
# mmcv's PolyLrUpdaterHook with linear warm-up sets, at 0-based iteration t,
#   lr = base * (1 - t / max_iters) ** 1.0 * (r + (1 - r) * min(t, warmup_iters) / warmup_iters),
# r = 1e-6: two chained (multiplied) schedulers reproduce it. mmengine's LinearLR /
# PolyLR reach their end factor at step end - 1, hence the `+ 1`.
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=warmup_iters + 1),
    dict(type='PolyLR', power=1.0, eta_min=0.0, by_epoch=False, begin=0, end=max_iters + 1),
]

default_hooks = dict(
    checkpoint=dict(max_keep_ckpts=3, save_best='mIoU', rule='greater'))
