# Runtime shared by every segmentation config (mmseg scope).
default_scope = 'mmseg'
# polaformerpp registers the backbone; seg_checks the checked datasets and CheckSegMapShape
custom_imports = dict(
    imports=['polaformerpp', 'polaformerpp.datasets.seg_checks'], allow_failed_imports=False)

env_cfg = dict(
    cudnn_benchmark=True,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'),
)
vis_backends = [dict(type='LocalVisBackend')]
visualizer = dict(type='SegLocalVisualizer', vis_backends=vis_backends, name='visualizer')
log_processor = dict(by_epoch=False)
log_level = 'INFO'
load_from = None
resume = False

# `tools/test.py CONFIG CKPT --tta`: the dataset's tta_pipeline (multi-scale + flip),
# softmax scores averaged over the views
tta_model = dict(type='SegTTAModel')
