from .attention import PolaLinearAttention, RoPESoftmaxAttention, build_token_mixer
from .blocks import ConvBN, ConvFFN, DropPath, PolaFormerBlock

__all__ = [
    'PolaLinearAttention', 'RoPESoftmaxAttention', 'build_token_mixer', 'ConvBN', 'ConvFFN',
    'DropPath', 'PolaFormerBlock'
]
