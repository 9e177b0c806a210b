"""The formatted text of a config, computed once per distinct text.

mmengine's ``Config.pretty_text`` runs yapf over the whole config each time it
is read: when the Runner logs its environment, dumps the config into the work
dir, starts the run (``RuntimeInfoHook``) and in the meta of every checkpoint.
On a small CPU that is about 0.2 s a call, more than a training step of a small
model, and a run that checkpoints every few iterations calls it dozens of times
on the same text. :func:`memoize_config_formatting` makes mmengine's config
module call a cached form of yapf's ``FormatCode``: the same input text and
style give the same output (yapf is a pure function of both), so every caller
still gets exactly what it got before.
"""
import functools
import json

from mmengine.config import config as _mmengine_config


def _cached(format_code):
    @functools.lru_cache(maxsize=16)
    def format_text(text, style_json, extra):
        return format_code(text, style_config=json.loads(style_json), **dict(extra))

    @functools.wraps(format_code)
    def cached_format_code(text, style_config=None, **kwargs):
        try:
            key = (json.dumps(style_config, sort_keys=True), tuple(sorted(kwargs.items())))
            hash(key)
        except TypeError:  # a style or option that is not plain data: no cache
            return format_code(text, style_config=style_config, **kwargs)
        return format_text(text, *key)

    cached_format_code.uncached = format_code
    return cached_format_code


def memoize_config_formatting():
    """Make ``mmengine.config.Config.pretty_text`` format each distinct text once (idempotent)."""
    format_code = _mmengine_config.FormatCode
    if getattr(format_code, 'uncached', None) is None:
        _mmengine_config.FormatCode = _cached(format_code)
