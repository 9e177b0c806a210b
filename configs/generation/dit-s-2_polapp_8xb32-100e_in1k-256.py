# DiT-S/2 with PolaFormer++ linear attention in every block, the recipe of the
# authors' release (`ZacharyMeng/PolaFormerPP`, downstream/dit/run-s.sh and train.py):
# class-conditional latent diffusion on ImageNet-1K at 256x256 (SD-VAE ft-EMA
# latents 32x32x4, patch 2), 1000-step linear schedule, learned-range variance
# (MSE + VB), label dropout 0.1, AdamW 1e-4 / wd 0, fp32 with TF32, no clipping,
# EMA 0.9999 every step, 8 GPUs x 32 = global batch 256, 100 epochs (500,400
# iterations). FID-50K: 250 DDPM steps, no guidance, uniformly random labels,
# against ADM's reference batch (configs/generation/README.md).
#
# Needs (no download at run time):
#   data/imagenet/{train,meta/train.txt}    mmpretrain ImageNet layout
#   data/sd-vae-ft-ema/        diffusers AutoencoderKL folder (stabilityai/sd-vae-ft-ema)
#   test only: data/inception/inception_v3_fid.pth (Inception-v3, TorchScript or torchvision
#   state dict) and data/imagenet/VIRTUAL_imagenet256_labeled.npz (ADM's reference batch)
default_scope = 'mmengine'
custom_imports = dict(imports=['polaformerpp.generation'], allow_failed_imports=False)
# exact resumption (RNG states, position in the data), atomic checkpoints, resume on
# torchrun restarts; the dotted name imports polaformerpp.engine when the runner is built
runner_type = 'polaformerpp.engine.PolaRunner'

image_size = 256
num_classes = 1000
data_root = 'data/imagenet'

model = dict(
    type='DiTDiffusion',
    dit=dict(
        type='DiT-S/2',
        input_size=image_size // 8,
        in_channels=4,
        num_classes=num_classes,
        class_dropout_prob=0.1,
        learn_sigma=True,
        attn_type='linear',  # 'softmax' for the original DiT attention
    ),
    allow_tf32=True,  # train.py:12-13 (matmul and cuDNN), sample_ddp.py:47
    space='latent',
    vae=dict(type='SDVAE', path='data/sd-vae-ft-ema', scale_factor=0.18215),
    num_timesteps=1000,
    # gen.sh: 250 respaced DDPM steps (no clipping of x0 in latent space), no guidance;
    # with guidance (--cfg-scale) only the first 3 latent channels are guided (models.py)
    sample_cfg=dict(num_steps=250, sampler='ddpm', cfg_scale=1.0, cfg_channels=3),
    data_preprocessor=dict(type='DiffusionDataPreprocessor'),
)

train_dataloader = dict(
    batch_size=32,
    num_workers=8,
    persistent_workers=True,
    pin_memory=True,
    drop_last=True,
    # DistributedSampler(shuffle, seed=global_seed=0) reshuffled every epoch, drop_last
    sampler=dict(type='DefaultSampler', shuffle=True, seed=0),
    collate_fn=dict(type='pseudo_collate'),
    dataset=dict(
        type='ClassImageFolder',
        data_root=data_root,
        data_prefix='train',
        ann_file='meta/train.txt',
        image_size=image_size,
        random_flip=True),
)
# FID-50K as gen.sh / sample_ddp.py: 50,000 samples of uniformly random labels,
# 32 per GPU, against the statistics of ADM's ImageNet-256 reference batch. The
# published numbers come from ADM's evaluator on tools/generation/sample.py's .npz.
test_dataloader = dict(
    batch_size=32,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='pseudo_collate'),
    dataset=dict(type='RandomClassLabels', num_samples=50000, num_classes=num_classes, seed=0),
)
test_evaluator = dict(
    type='GenerationFID',
    feature_extractor=dict(type='InceptionV3Features', weights='data/inception/inception_v3_fid.pth'),
    reference=data_root + '/VIRTUAL_imagenet256_labeled.npz')
test_cfg = dict(type='TestLoop')
val_dataloader = None
val_evaluator = None
val_cfg = None

# 1,281,167 images // 256 = 5,004 iterations per epoch
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=100)
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-4, weight_decay=0.0))
param_scheduler = []  # constant learning rate
auto_scale_lr = dict(base_batch_size=256, enable=False)

# decay 0.9999 after every optimizer step from the first; checkpoints hold the EMA
# weights in state_dict, which sampling uses (download.py: the 'ema' entry)
custom_hooks = [
    dict(type='EMAHook', ema_type='ExponentialMovingAverage', momentum=1e-4,
         update_buffers=False, priority='ABOVE_NORMAL'),
]
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=100),
    param_scheduler=dict(type='ParamSchedulerHook'),
    # every 10,000 iterations (train.py --ckpt-every); gen.sh evaluates iteration 450,000
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=10000, max_keep_ckpts=3),
    sampler_seed=dict(type='DistSamplerSeedHook'),
)
log_processor = dict(by_epoch=False)

env_cfg = dict(
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'),
)
vis_backends = [dict(type='LocalVisBackend')]
visualizer = dict(type='Visualizer', vis_backends=vis_backends)
log_level = 'INFO'
load_from = None
resume = False
# seed + rank on each process (global_seed * world_size + rank)
randomness = dict(seed=0, diff_rank_seed=True, deterministic=False)
