from .attention import GatedAttention, PolaLinearAttention, RoPESoftmaxAttention, build_token_mixer
from .blocks import ConvBN, ConvFFN, PolaFormerBlock

__all__ = [
    'GatedAttention', 'PolaLinearAttention', 'RoPESoftmaxAttention', 'build_token_mixer', 'ConvBN',
    'ConvFFN', 'PolaFormerBlock'
]
