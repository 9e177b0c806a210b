from .polaformerpp import PolaFormerPP
from .polaformerpp_convert import convert_official_state_dict

__all__ = ['PolaFormerPP', 'convert_official_state_dict']
