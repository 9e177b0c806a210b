# DiT-L/2 with PolaFormer++ linear attention: the DiT-S/2 recipe with a larger model.
_base_ = ['./dit-s-2_polapp_8xb32-400k_in1k-256.py']

model = dict(dit=dict(type='DiT-L/2'))
