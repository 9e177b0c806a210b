# DiT-S/2 with PolaFormer++ linear attention in every block: class-conditional
# latent diffusion on ImageNet-1K at 256x256 (SD-VAE latents 32x32x4, patch 2),
# 1000-step linear schedule, learned-range variance (hybrid loss), label
# dropout 0.1 for classifier-free guidance. AdamW 1e-4, wd 0, EMA 0.9999,
# 8 GPUs x 32 = global batch 256, 400k iterations.
#
# Needs (no download at run time):
#   data/imagenet/{train,val,meta/train.txt,meta/val.txt}    mmpretrain ImageNet layout
#   data/sd-vae-ft-ema/        diffusers AutoencoderKL folder (stabilityai/sd-vae-ft-ema)
#   data/inception/inception_v3_fid.pth   Inception-v3 (TorchScript or torchvision state dict), test only
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
    space='latent',
    vae=dict(type='SDVAE', path='data/sd-vae-ft-ema', scale_factor=0.18215),
    num_timesteps=1000,
    # evaluation protocol: 250 respaced DDPM steps; cfg_scale=1.5 for guided FID
    sample_cfg=dict(num_steps=250, sampler='ddpm', cfg_scale=1.0),
    data_preprocessor=dict(type='DiffusionDataPreprocessor'),
)

train_dataloader = dict(
    batch_size=32,
    num_workers=8,
    persistent_workers=True,
    pin_memory=True,
    drop_last=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    collate_fn=dict(type='pseudo_collate'),
    dataset=dict(
        type='ClassImageFolder',
        data_root=data_root,
        data_prefix='train',
        ann_file='meta/train.txt',
        image_size=image_size,
        random_flip=True),
)
# FID of 50K samples (one per ImageNet val image, with its label) against
# the val images themselves, in Inception-v3 pool3 space.
test_dataloader = dict(
    batch_size=32,
    num_workers=8,
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
        test_mode=True),
)
test_evaluator = dict(
    type='GenerationFID',
    feature_extractor=dict(type='InceptionV3Features', weights='data/inception/inception_v3_fid.pth'),
    reference='batch')
test_cfg = dict(type='TestLoop')
val_dataloader = None
val_evaluator = None
val_cfg = None

train_cfg = dict(type='IterBasedTrainLoop', max_iters=400000)
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-4, weight_decay=0.0))
param_scheduler = []  # constant learning rate
auto_scale_lr = dict(base_batch_size=256, enable=False)

custom_hooks = [
    dict(type='EMAHook', ema_type='ExponentialMovingAverage', momentum=1e-4,  # decay 0.9999
         update_buffers=False, priority='ABOVE_NORMAL'),
]
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=100),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=50000, max_keep_ckpts=3),
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
randomness = dict(seed=0, deterministic=False)
