# COCO 2017 object detection (boxes only): mmdet's dataset settings (1333x800
# single scale, flip; 2 images per GPU, the configs are meant for 8 GPUs = 16
# images per iteration) with CheckedCocoDataset, mmdet's CocoDataset with clear
# errors for broken annotation files (polaformerpp.datasets.coco_checks,
# imported by ./default_runtime.py).
_base_ = 'mmdet::_base_/datasets/coco_detection.py'

dataset_type = 'CheckedCocoDataset'
train_dataloader = dict(dataset=dict(type=dataset_type))
val_dataloader = dict(dataset=dict(type=dataset_type))
test_dataloader = val_dataloader
