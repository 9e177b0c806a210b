# A pixel-space DiT small enough for a CPU: 4 blocks of width 128 (4 heads,
# PolaFormer++ attention), patch 4 on 32x32 RGB images of the generated shapes
# set (tools/misc/make_demo_data.py DIR --size 32), label table N(0, 1) so that
# a run this short learns to use the label (check a checkpoint with
# tools/analysis_tools/label_swap_gap.py). Validation samples one image per val
# label (25 DDIM steps) and scores FID against the val images with a fixed
# random conv net (a smoke-test stand-in for Inception: not comparable to
# published FID). Real labelled data: ./dit-tiny-4_polapp_1xb32-2k_demo-digits-16.py.
#
#   python tools/misc/make_demo_data.py data/demo_shapes32 --size 32
#   python tools/train.py configs/generation/dit-tiny-4_polapp_1xb32-2k_demo-shapes-32.py
_base_ = ['./dit-s-2_polapp_8xb32-100e_in1k-256.py']

image_size = 32
num_classes = 4
data_root = 'data/demo_shapes32'

model = dict(
    dit=dict(
        _delete_=True,
        type='DiT',
        arch=dict(depth=4, hidden_size=128, num_heads=4, patch_size=4),
        input_size=image_size,
        in_channels=3,
        num_classes=num_classes,
        class_dropout_prob=0.1,
        learn_sigma=True,
        attn_type='linear',
        # DiT's N(0, 0.02) label table is swamped by the timestep embedding in a
        # run this short (the label then barely reaches the network); N(0, 1) is
        # comparable to it from the first step. The published configs keep 0.02.
        label_embed_std=1.0),
    space='pixel',
    vae=None,
    allow_tf32=None,
    sample_cfg=dict(num_steps=25, sampler='ddim', cfg_scale=1.0, cfg_channels=None),
)

train_dataloader = dict(
    batch_size=32,
    num_workers=0,
    persistent_workers=False,
    pin_memory=False,
    sampler=dict(_delete_=True, type='InfiniteSampler', shuffle=True),
    dataset=dict(data_root=data_root, image_size=image_size))
val_dataloader = dict(
    _delete_=True,
    batch_size=40,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='pseudo_collate'),
    dataset=dict(
        type='ClassImageFolder',
        data_root=data_root,
        data_prefix='val',
        ann_file='meta/val.txt',
        image_size=image_size,
        random_flip=False,
        test_mode=True))
val_evaluator = dict(
    _delete_=True,
    type='GenerationFID', feature_extractor=dict(type='RandomConvFeatures', seed=0),
    reference='batch')
val_cfg = dict(_delete_=True, type='ValLoop')
test_dataloader = val_dataloader
test_evaluator = val_evaluator

max_iters = 2000
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=max_iters, val_interval=1000)
optim_wrapper = dict(optimizer=dict(lr=1e-3))
param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=50)]
auto_scale_lr = dict(base_batch_size=32)
# a short run: average over the last ~100 steps instead of ~10k
custom_hooks = [
    dict(type='EMAHook', ema_type='ExponentialMovingAverage', momentum=0.01,
         update_buffers=False, priority='ABOVE_NORMAL'),
]
randomness = dict(diff_rank_seed=False)
default_hooks = dict(
    logger=dict(interval=10),
    checkpoint=dict(interval=1000, max_keep_ckpts=1))
