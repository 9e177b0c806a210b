# The CPU demo DiT (4 blocks of width 128, PolaFormer++ attention, patch 4,
# label table N(0, 1)) on real labelled images: scikit-learn's 1,797 handwritten
# digits, 10 classes (tools/misc/make_demo_digits.py writes them upscaled to
# 32x32; they are read at 16x16, 4x4 = 16 tokens). Samples follow their label:
# a classifier trained on the real digits reads guided samples (cfg 3) as the
# requested class far above chance after ~1k iterations (see README.md).
#
#   python tools/misc/make_demo_digits.py data/demo_digits32
#   python tools/train.py configs/generation/dit-tiny-4_polapp_1xb32-2k_demo-digits-16.py
#   python tools/analysis_tools/label_swap_gap.py CONFIG work_dirs/.../iter_2000.pth
#   python tools/generation/sample.py CONFIG CKPT --out-dir samples --labels 0 1 2 3 4 5 6 7 8 9 \
#       --num-samples 100 --cfg-scale 3 --steps 25 --sampler ddim
_base_ = ['./dit-tiny-4_polapp_1xb32-2k_demo-shapes-32.py']

image_size = 16
num_classes = 10
data_root = 'data/demo_digits32'

model = dict(dit=dict(input_size=image_size, num_classes=num_classes))

# digits are not mirror-symmetric: no flips
train_dataloader = dict(dataset=dict(data_root=data_root, image_size=image_size, random_flip=False))
val_dataloader = dict(dataset=dict(data_root=data_root, image_size=image_size))
test_dataloader = val_dataloader
