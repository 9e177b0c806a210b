# mmdet's runtime (mmdet scope, hooks, visualizer, logging) plus the imports
# that register the PolaFormer++ backbone and CheckedCocoDataset, and at most
# three kept checkpoints.
_base_ = 'mmdet::_base_/default_runtime.py'

custom_imports = dict(
    imports=['polaformerpp', 'polaformerpp.datasets.coco_checks', 'polaformerpp.engine'],
    allow_failed_imports=False)
# exact resumption (RNG states, mid-epoch position), atomic checkpoints, resume on torchrun restarts
runner_type = 'PolaRunner'

default_hooks = dict(checkpoint=dict(max_keep_ckpts=3))
