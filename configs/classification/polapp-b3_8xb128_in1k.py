# PolaFormer++-b3 on ImageNet-1K: the published 300-epoch recipe, 8 GPUs x 128 images.
# As b0 with the arch and the batch changed (drop path from the arch zoo).
_base_ = ['./polapp-b0_8xb256_in1k.py']

model = dict(backbone=dict(arch='b3'))

train_dataloader = dict(batch_size=128)

# lr 5e-4 per 512 images -> 0.001 for 1024
optim_wrapper = dict(optimizer=dict(lr=0.001))
auto_scale_lr = dict(base_batch_size=1024)
