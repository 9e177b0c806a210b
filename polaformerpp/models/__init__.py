from .backbones import PolaFormerPP  # noqa: F401 (registers the backbone)

__all__ = ['PolaFormerPP']
