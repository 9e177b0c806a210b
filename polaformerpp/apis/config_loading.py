"""Shared by the task APIs: a config from a path or a ``Config``, its imports, the model built."""
import copy
from pathlib import Path
from typing import Optional, Union

from mmengine.config import Config
from mmengine.registry import MODELS, DefaultScope
from mmengine.utils import import_modules_from_strings

from polaformerpp.utils.checkpoint import load_model_weights

__all__ = ['load_config', 'build_from_config']


def load_config(config: Union[str, Path, Config], cfg_options: Optional[dict] = None) -> Config:
    """A copy of ``config`` (a file path or a ``Config``) with ``cfg_options`` merged in.

    ``cfg_options`` takes dotted keys, as ``--cfg-options`` does:
    ``{'model.network.upscale': 2}``. The config's ``custom_imports`` are imported.
    """
    if isinstance(config, (str, Path)):
        path = str(config)
        if not Path(path).is_file():
            raise FileNotFoundError(f'config file not found: {path!r}')
        cfg = Config.fromfile(path)
    elif isinstance(config, Config):
        cfg = copy.deepcopy(config)
    else:
        raise TypeError(f'config must be a file path or an mmengine Config, got {type(config).__name__}')
    if cfg_options is not None:
        if not isinstance(cfg_options, dict):
            raise TypeError(f'cfg_options must be a dict of dotted keys, got {type(cfg_options).__name__}')
        cfg.merge_from_dict(cfg_options)
    if 'model' not in cfg:
        raise KeyError('the config has no `model` entry')
    if cfg.get('custom_imports'):
        import_modules_from_strings(**cfg.custom_imports)
    return cfg


def build_from_config(cfg: Config, expected: type, checkpoint: Optional[str], device: str, what: str,
                      allow_partial: bool = False, unsafe_load: bool = False):
    """``cfg.model`` built (an instance of ``expected``), weights loaded, on ``device``, in eval mode.

    The config is attached as ``model.cfg`` (as ``mmdet.apis.init_detector`` does).
    The checkpoint is read onto the CPU first, safely (``weights_only=True``;
    ``unsafe_load=True`` unpickles a trusted file in full) and strictly: a
    checkpoint that leaves tensors of the model unfilled, has unexpected keys or
    shape mismatches raises :class:`~polaformerpp.utils.CheckpointMismatchError`
    unless ``allow_partial`` (see :func:`polaformerpp.utils.load_model_weights`).
    """
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
        model = MODELS.build(cfg.model)
    if not isinstance(model, expected):
        raise TypeError(f'the config\'s model is a {type(model).__name__}; {what} needs a '
                        f'{expected.__name__} config')
    if checkpoint is not None:
        load_model_weights(model, str(checkpoint), allow_partial=allow_partial, unsafe=True if unsafe_load else None)
    model.cfg = cfg
    model.to(device)
    model.eval()
    return model
