# PolaFormer++ lightweight SR, x3: DIV2K, 64x64 LR patches (192x192 HR), batch 2 GPUs x 16,
# L1, Adam 2e-4 (0.9, 0.99), halved at 250k/400k/450k/475k of 500k iterations.
# Trained from scratch: the published x3 model (the paper: Set5 34.79/0.9304, ~0.93M params).
# Network: 930,347 parameters.
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
