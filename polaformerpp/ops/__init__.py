from .pola_attention import available_backends, pola_attention, pola_attention_torch, pola_feature_maps
from .rope import apply_rope, pola_rope_tables, rope_2d_tables, rope_frequencies

__all__ = [
    'pola_attention', 'pola_attention_torch', 'pola_feature_maps', 'available_backends',
    'pola_rope_tables', 'rope_2d_tables', 'rope_frequencies', 'apply_rope'
]
