# DiT-XL/2 with PolaFormer++ linear attention. The authors' release has no DiT-XL
# run script: this is their DiT-B/2 and DiT-L/2 recipe (run-b.sh, run-l.sh:
# 90 epochs at global batch 256) with the XL model (train.py's default model).
_base_ = ['./dit-b-2_polapp_8xb32-90e_in1k-256.py']

model = dict(dit=dict(type='DiT-XL/2'))
