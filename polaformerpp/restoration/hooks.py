"""Save SR outputs as PNG during ``tools/test.py`` (registered in mmengine's root ``HOOKS``).

The SR configs list it, disabled, in ``default_hooks``; enable it from the
command line::

    python tools/test.py CONFIG CKPT --cfg-options default_hooks.save_sr.save_dir=results/x3

Images go to ``<save_dir>/<dataset_name>/<img_name>.png`` (uint8, exactly
the values the metrics scored). A relative ``save_dir`` is taken from the
current directory.
"""
import os
import os.path as osp
from typing import Optional, Sequence

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from .transforms import write_rgb

__all__ = ['SaveSRImagesHook']


@HOOKS.register_module()
class SaveSRImagesHook(Hook):
    """Write every test prediction (``pred_img``) to ``save_dir``; does nothing if ``save_dir`` is None.

    Args:
        save_dir (str | None): output folder.
        suffix (str): appended to the image name (e.g. ``'_x3'``).
    """

    priority = 'LOW'

    def __init__(self, save_dir: Optional[str] = None, suffix: str = ''):
        self.save_dir = save_dir
        self.suffix = suffix

    def after_test_iter(self, runner, batch_idx: int, data_batch=None,
                        outputs: Optional[Sequence] = None) -> None:
        if self.save_dir is None or not outputs:
            return
        for index, sample in enumerate(outputs):
            img = sample.get('pred_img')
            if img is None:
                continue
            name = sample.get('img_name') or f'{batch_idx:06d}_{index}'
            folder = osp.join(osp.abspath(self.save_dir), sample.get('dataset_name') or '')
            os.makedirs(folder, exist_ok=True)
            write_rgb(osp.join(folder, f'{name}{self.suffix}.png'),
                      img.detach().cpu().numpy().transpose(1, 2, 0))
