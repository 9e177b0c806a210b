# PolaFormer++ lightweight SR, x2. The release has no x2 recipe: this is its x3/x4 recipe
# with the scale changed (192x192 HR patches, so 96x96 LR), from scratch; validation on
# Set14 as x3.
_base_ = ['./polapp-srlight_x3_8xb16-500k_div2k-192.py']

scale = 2
model = dict(network=dict(upscale=scale))
train_dataloader = dict(dataset=dict(scale=scale))
val_dataloader = dict(dataset=dict(scale=scale))
test_dataloader = dict(
    dataset=dict(datasets=[
        dict(type='SRBenchmarkDataset', name=name, scale=scale, data_root=_base_.benchmark_root,
             pipeline=_base_.test_pipeline) for name in _base_.benchmark_names
    ]))
