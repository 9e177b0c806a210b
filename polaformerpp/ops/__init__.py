"""The attention op: :func:`pola_attention` (see :mod:`polaformerpp.ops.pola_attention`) and its RoPE tables."""
from .pola_attention import (
                             available_backends,
                             gated_output,
                             pola_attention,
                             pola_attention_gated,
                             pola_attention_torch,
                             pola_feature_maps,
)
from .rope import (
                             RopeGrid,
                             apply_rope,
                             apply_rope_2d,
                             pola_rope_factors,
                             pola_rope_tables,
                             rope_2d_tables,
                             rope_frequencies,
)

__all__ = [
    'pola_attention', 'pola_attention_gated', 'gated_output', 'pola_attention_torch', 'pola_feature_maps',
    'available_backends', 'RopeGrid',
    'pola_rope_tables', 'pola_rope_factors', 'rope_2d_tables', 'rope_frequencies', 'apply_rope',
    'apply_rope_2d'
]
