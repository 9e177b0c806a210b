# Runtime shared by every classification config (mmpretrain scope).
default_scope = 'mmpretrain'
custom_imports = dict(imports=['polaformerpp', 'polaformerpp.engine'], allow_failed_imports=False)
# exact resumption (RNG states, mid-epoch position), atomic checkpoints, resume on torchrun restarts
runner_type = 'PolaRunner'

default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=100),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', interval=1, max_keep_ckpts=3, save_best='auto'),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='VisualizationHook', enable=False),
)

# the authors' main script: cudnn.benchmark on, seed 0 + rank
env_cfg = dict(
    cudnn_benchmark=True,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'),
)

vis_backends = [dict(type='LocalVisBackend')]
visualizer = dict(type='UniversalVisualizer', vis_backends=vis_backends)

log_level = 'INFO'
load_from = None
resume = False
randomness = dict(seed=0, diff_rank_seed=True, deterministic=False)
