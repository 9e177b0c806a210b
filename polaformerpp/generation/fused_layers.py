"""The fused form of the DiT's token attention, registered with :func:`polaformerpp.ops.fusion.fuse_modules`.

:class:`~.dit_layers.PolaTokenAttention` subclasses the backbone's
:class:`~polaformerpp.models.layers.PolaLinearAttention`; its fused form takes
the backbone attention's fused features (the LePE add and the gate in the
op's readout, CPU training from the projection to the gated output as one
autograd Function) under the token attention's own ``forward(x, grid)``.
Importing this module registers it; :class:`~.dit.DiT` does at build time
unless ``fused=False``.
"""
from polaformerpp.ops.fusion import FusedPolaLinearAttention, register_fused_form

from .dit_layers import PolaTokenAttention

__all__ = ['FusedPolaTokenAttention']


class FusedPolaTokenAttention(PolaTokenAttention, FusedPolaLinearAttention):
    """:class:`~.dit_layers.PolaTokenAttention` whose ``(B, gh, gw, C)`` step is
    :class:`~polaformerpp.ops.fusion.FusedPolaLinearAttention`'s: same parameters, same outputs."""


register_fused_form(PolaTokenAttention, FusedPolaTokenAttention)
