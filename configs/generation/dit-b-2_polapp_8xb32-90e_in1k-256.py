# DiT-B/2 with PolaFormer++ linear attention: the authors' run-b.sh, the DiT-S/2
# recipe with a larger model for 90 epochs (450,360 iterations; gen.sh evaluates
# the 450,000-iteration checkpoint).
_base_ = ['./dit-s-2_polapp_8xb32-100e_in1k-256.py']

model = dict(dit=dict(type='DiT-B/2'))
train_cfg = dict(max_epochs=90)
