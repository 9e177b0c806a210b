# PolaFormer++ lightweight SR, x2: DIV2K, 64x64 LR patches (128x128 HR), batch 2 GPUs x 16,
# L1, Adam 2e-4 (0.9, 0.99), halved at 250k/400k/450k/475k of 500k iterations.
# As x3 with the scale changed (the network's upsampler and every data set), from
# scratch by default. To start from the x3 model instead
# (as MambaIR-style light models usually do), pass the x3 checkpoint:
#   python tools/train.py configs/super_resolution/polapp-srlight_x2_2xb16-500k_div2k-64.py \
#       --cfg-options load_from=work_dirs/polapp-srlight_x3_2xb16-500k_div2k-64/iter_500000.pth
# Every weight but the upsampler's last conv (its output channels are 3*s^2) is
# loaded; mmengine skips that one with a size-mismatch warning and keeps its
# fresh initialisation.
_base_ = ['./polapp-srlight_x3_2xb16-500k_div2k-64.py']

scale = 2
model = dict(network=dict(upscale=scale))
train_dataloader = dict(dataset=dict(scale=scale))
val_dataloader = dict(dataset=dict(scale=scale))
test_dataloader = dict(
    dataset=dict(datasets=[
        dict(type='SRBenchmarkDataset', name=name, scale=scale, data_root=_base_.benchmark_root,
             pipeline=_base_.test_pipeline) for name in _base_.benchmark_names
    ]))
