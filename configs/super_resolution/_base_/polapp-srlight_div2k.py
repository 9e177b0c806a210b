# PolaFormer++ lightweight SR: everything but the scale, as the authors' release
# (ZacharyMeng/PolaFormerPP, downstream/sr/options/{train,test}/mambairv2/*.yml) trains
# and tests it. The x2/x3/x4 configs next to this folder set the scale (network,
# training set, validation and test sets). Pure mmengine: no OpenMMLab library scope.
default_scope = None
custom_imports = dict(imports=['polaformerpp.restoration'], allow_failed_imports=False)
# exact resumption (RNG states, position in the data), atomic checkpoints, resume on
# torchrun restarts; the dotted name imports polaformerpp.engine when the runner is built
runner_type = 'polaformerpp.engine.PolaRunner'

# ---------------------------------------------------------------- model
model = dict(
    type='SRRestorer',
    # the release's network pads its input by mirroring to a multiple of the window (16)
    pad_to_window=True,
    # and its test() runs images in (size // 200 + 1)^2 parts with part // 10 pixels of overlap
    tile=dict(split_size=200, overlap_div=10),
    network=dict(
        type='PolaPPSRLight',
        upscale=3,  # set by the x{s} configs
        embed_dims=48,
        depths=(5, 5, 5, 5),
        num_heads=4,  # head dim 12
        window_size=16,
        mlp_ratio=1.0,
        attn_backend='auto'),  # Triton on CUDA, torch elsewhere
    data_preprocessor=dict(type='SRDataPreprocessor', mean=(0.4488, 0.4371, 0.4040)))

# ---------------------------------------------------------------- data
# DIV2K: data/DIV2K/DIV2K_train_HR/0001.png, data/DIV2K/DIV2K_train_LR_bicubic/X3/0001x3.png
# test sets: data/benchmark/{Set5,Set14,B100,Urban100,Manga109}/ (layouts: SRBenchmarkDataset)
data_root = 'data/DIV2K'
benchmark_root = 'data/benchmark'
benchmark_names = ['Set5', 'Set14', 'B100', 'Urban100', 'Manga109']
gt_patch_size = 192  # HR patch at every scale (LR 96/64/48 at x2/x3/x4)

train_pipeline = [
    dict(type='LoadPairedImages'),
    dict(type='PairedRandomCrop', gt_patch_size=gt_patch_size),
    dict(type='PairedFlipRot', hflip=True, vflip=True, rot90=True),
    dict(type='PackSRInputs'),
]
test_pipeline = [
    dict(type='LoadPairedImages'),
    dict(type='PackSRInputs'),
]

train_dataloader = dict(
    batch_size=16,  # x 8 GPUs = 128 patches per iteration
    num_workers=8,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        type='PairedImageDataset',
        data_root=data_root,
        gt_dir='DIV2K_train_HR',
        lr_dir='DIV2K_train_LR_bicubic/X{scale}',
        lr_filename_tmpl='{stem}x{scale}',
        scale=3,
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1,  # test images differ in size
    num_workers=2,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type='SRBenchmarkDataset', name='Set14', scale=3, data_root=benchmark_root,
        pipeline=test_pipeline))
test_dataloader = dict(
    batch_size=1,
    num_workers=2,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type='ConcatDataset',
        datasets=[
            dict(type='SRBenchmarkDataset', name=name, scale=3, data_root=benchmark_root,
                 pipeline=test_pipeline) for name in benchmark_names
        ]))
# Y channel (BT.601), border crop = scale; with several test sets each also
# gets '<set>/PSNR' and '<set>/SSIM'. Validation scores PSNR only, as the release.
val_evaluator = [dict(type='PSNR')]
test_evaluator = [dict(type='PSNR'), dict(type='SSIM')]

# ---------------------------------------------------------------- schedule
optim_wrapper = dict(
    type='OptimWrapper', optimizer=dict(type='Adam', lr=2e-4, betas=(0.9, 0.99), weight_decay=0))
param_scheduler = [
    dict(type='MultiStepLR', by_epoch=False, milestones=[250000, 400000, 450000, 475000],
         gamma=0.5)
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=500000, val_interval=5000)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
auto_scale_lr = dict(base_batch_size=128)  # 8 GPUs x 16 patches

# ---------------------------------------------------------------- runtime
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=200),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=5000, max_keep_ckpts=3,
                    save_best='PSNR', rule='greater'),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    # tools/test.py ... --cfg-options default_hooks.save_sr.save_dir=DIR writes the SR PNGs
    save_sr=dict(type='SaveSRImagesHook', save_dir=None),
)
env_cfg = dict(
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'),
)
log_processor = dict(by_epoch=False)
vis_backends = [dict(type='LocalVisBackend')]
visualizer = dict(type='Visualizer', vis_backends=vis_backends)
log_level = 'INFO'
load_from = None
resume = False
randomness = dict(seed=10, diff_rank_seed=True)  # seed 10 + rank
