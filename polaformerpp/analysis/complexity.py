"""Parameter and FLOP counting for any config of the project.

FLOPs follow the fvcore/mmengine convention (one multiply-accumulate counts
as one FLOP) and extend mmengine's ``FlopAnalyzer`` with
``scaled_dot_product_attention`` (``N*M*d + N*M*dv`` per head), which it does
not count by itself, so softmax attention is included. Linear attention is
counted through the einsums of the torch backend of ``pola_attention``.
"""
from typing import Dict, Tuple

import numpy as np
import torch.nn as nn

__all__ = ['sdpa_flop_handle', 'count_complexity']


def sdpa_flop_handle(inputs, outputs) -> int:
    """FLOPs of ``aten::scaled_dot_product_attention``: ``q k^T`` plus ``attn v``."""
    from mmengine.analysis.jit_handles import get_shape
    q, k, v = (get_shape(inputs[i]) for i in range(3))
    batch = int(np.prod(q[:-2]))
    return batch * q[-2] * k[-2] * (q[-1] + v[-1])


def count_complexity(model: nn.Module, inputs: Tuple, show_table: bool = False) -> Dict:
    """Count ``model(*inputs)``.

    Returns:
        dict: ``flops`` (int), ``params`` (int), ``by_operator`` (dict) and,
        if ``show_table``, ``table`` (str, per-module breakdown).
    """
    from mmengine.analysis import FlopAnalyzer, parameter_count
    from mmengine.analysis.print_helper import complexity_stats_table
    analyzer = FlopAnalyzer(model, inputs)
    analyzer.set_op_handle('aten::scaled_dot_product_attention', sdpa_flop_handle)
    analyzer.unsupported_ops_warnings(False)
    analyzer.uncalled_modules_warnings(False)
    result = dict(flops=int(analyzer.total()), params=int(parameter_count(model)['']),
                  by_operator=dict(analyzer.by_operator()))
    if show_table:
        result['table'] = complexity_stats_table(analyzer, max_depth=3, show_param_shapes=False)
    return result
