# DiT-L/2 with PolaFormer++ linear attention: the authors' run-l.sh, the DiT-B/2
# recipe (90 epochs, 450,360 iterations) with a larger model.
_base_ = ['./dit-b-2_polapp_8xb32-90e_in1k-256.py']

model = dict(dit=dict(type='DiT-L/2'))
