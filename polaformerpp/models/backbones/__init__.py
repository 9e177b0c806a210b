from .polaformerpp import PolaFormerPP

__all__ = ['PolaFormerPP']
