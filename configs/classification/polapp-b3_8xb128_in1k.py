# PolaFormer++-b3 on ImageNet-1K: cfgs/pola_b3.yaml, as pola_b0.yaml but 128 images per GPU
# (pola_b3.yaml:6): b0's config with the arch and the batch changed.
_base_ = ['./polapp-b0_8xb256_in1k.py']

model = dict(backbone=dict(arch='b3'))  # drop path 0.15 from the arch zoo

# 8 GPUs x 128 images; lr, warm-up start and final lr per 512 images x 1024 / 512 (the schedule's
# ratios are b0's: warm-up from 5e-7, cosine to 1e-7 per 512 images, pola_b3.yaml:9)
train_dataloader = dict(batch_size=128)
optim_wrapper = dict(optimizer=dict(lr=5e-4 * 1024 / 512))
auto_scale_lr = dict(base_batch_size=1024)
