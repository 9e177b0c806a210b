# PolaFormer++ lightweight SR, x3, the release's recipe (train_MambaIRv2_lightSR_x3.yml):
# DIV2K, 192x192 HR patches (64x64 LR), 8 GPUs x 16, L1, Adam 2e-4 (0.9, 0.99), halved at
# 250k/400k/450k/475k of 500k iterations, from scratch; validation on Set14.
# The published x3 model (Set5 34.79/0.9304, 930,347 parameters).
_base_ = ['./_base_/polapp-srlight_div2k.py']

scale = 3
model = dict(network=dict(upscale=scale))
train_dataloader = dict(dataset=dict(scale=scale))
val_dataloader = dict(dataset=dict(scale=scale))
test_dataloader = dict(
    dataset=dict(datasets=[
        dict(type='SRBenchmarkDataset', name=name, scale=scale, data_root=_base_.benchmark_root,
             pipeline=_base_.test_pipeline) for name in _base_.benchmark_names
    ]))
