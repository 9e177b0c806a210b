# PolaFormer++ lightweight SR, x4, the release's recipe (train_MambaIRv2_lightSR_x4.yml):
# as x3 with the scale changed (192x192 HR patches, so 48x48 LR), from scratch;
# validation on Set5.
_base_ = ['./polapp-srlight_x3_8xb16-500k_div2k-192.py']

scale = 4
model = dict(network=dict(upscale=scale))
train_dataloader = dict(dataset=dict(scale=scale))
val_dataloader = dict(dataset=dict(name='Set5', scale=scale))
test_dataloader = dict(
    dataset=dict(datasets=[
        dict(type='SRBenchmarkDataset', name=name, scale=scale, data_root=_base_.benchmark_root,
             pipeline=_base_.test_pipeline) for name in _base_.benchmark_names
    ]))
