from .attention import GatedAttention, PolaLinearAttention, RoPESoftmaxAttention, build_token_mixer
from .blocks import ChannelLayerNorm, ConvBN, ConvFFN, PolaFormerBlock, Stem

__all__ = [
    'GatedAttention', 'PolaLinearAttention', 'RoPESoftmaxAttention', 'build_token_mixer', 'ConvBN',
    'ConvFFN', 'PolaFormerBlock', 'Stem', 'ChannelLayerNorm'
]
