# mmseg's runtime (mmseg scope, visualizer, logging by iteration, the SegTTAModel
# that `tools/test.py CONFIG CKPT --tta` uses: the dataset's tta_pipeline,
# softmax scores averaged over the views) plus the imports that register the
# PolaFormer++ backbone (polaformerpp) and the checked datasets and
# CheckSegMapShape (polaformerpp.datasets.seg_checks).
_base_ = 'mmseg::_base_/default_runtime.py'

custom_imports = dict(
    imports=['polaformerpp', 'polaformerpp.datasets.seg_checks', 'polaformerpp.engine'],
    allow_failed_imports=False)
# exact resumption (RNG states, position in the data), atomic checkpoints, resume on torchrun restarts
runner_type = 'PolaRunner'
