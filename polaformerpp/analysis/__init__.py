from .complexity import count_complexity, sdpa_flop_handle

__all__ = ['count_complexity', 'sdpa_flop_handle']
