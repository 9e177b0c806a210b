from .attention_stats import (
    METHODS,
    AttentionCapture,
    AttentionRecorder,
    agg_pyplot,
    attention_entropy,
    attention_map,
    attention_weights,
    capture_entropy,
    entropy_table,
    format_entropy_table,
    kernel_attention_weights,
    load_images,
    load_model,
    pola_attention_modules,
    pola_attention_weights,
    polarity_mixing,
    query_indices,
    run_model,
    short_layer_name,
    softmax_attention_weights,
    temperature_pairs,
    temperature_summary,
)
from .complexity import count_complexity, sdpa_flop_handle
from .timing import SGEMM_SIZE, sgemm_gflops, sgemm_seconds, timed_calls

__all__ = [
    'count_complexity', 'sdpa_flop_handle', 'METHODS', 'AttentionCapture', 'AttentionRecorder',
    'agg_pyplot', 'attention_entropy', 'attention_map', 'attention_weights', 'capture_entropy',
    'entropy_table', 'format_entropy_table', 'kernel_attention_weights', 'load_images', 'load_model',
    'pola_attention_modules', 'pola_attention_weights', 'polarity_mixing', 'query_indices',
    'run_model', 'short_layer_name', 'softmax_attention_weights', 'temperature_pairs',
    'temperature_summary', 'timed_calls', 'sgemm_seconds', 'sgemm_gflops', 'SGEMM_SIZE'
]
