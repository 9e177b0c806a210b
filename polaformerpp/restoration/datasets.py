"""Paired SR datasets (registered in mmengine's root ``DATASETS``).

:class:`PairedImageDataset` pairs a folder of HR images with a folder of LR
images (``lr_dir``, files named ``lr_filename_tmpl``) or, with
``lr_dir=None``, degrades each HR image on the fly with MATLAB-compatible
bicubic ``imresize`` (see :class:`~.transforms.LoadPairedImages`).

DIV2K layout::

    data/DIV2K/DIV2K_train_HR/0001.png
    data/DIV2K/DIV2K_train_LR_bicubic/X3/0001x3.png

:class:`SRBenchmarkDataset` finds one of the usual layouts of Set5, Set14,
B100, Urban100 and Manga109 under ``data_root/<name>/`` (first match wins):

1. ``HR/`` + ``LR_bicubic/X{s}/{stem}x{s}.png``  (EDSR/RCAN "benchmark" release;
   ``{stem}_LRBI_x{s}.png`` also found, as Manga109 is often named)
2. ``GTmod12/`` + ``LRbicx{s}/{stem}.png``      (BasicSR downloads)
3. ``HR/`` or ``GTmod12/`` or ``original/`` or the images directly in
   ``<name>/``, without LR images: LR made on the fly with ``imresize``.
"""
import os
import os.path as osp
from typing import List, Optional, Sequence, Union

from mmengine.dataset import BaseDataset
from mmengine.registry import DATASETS

__all__ = ['IMG_EXTENSIONS', 'PairedImageDataset', 'SRBenchmarkDataset']

IMG_EXTENSIONS = ('.png', '.bmp', '.jpg', '.jpeg', '.tif', '.tiff', '.ppm', '.webp')


def _list_images(folder: str) -> List[str]:
    if not osp.isdir(folder):
        raise FileNotFoundError(f'image folder not found: {folder}')
    return sorted(f for f in os.listdir(folder) if f.lower().endswith(IMG_EXTENSIONS))


@DATASETS.register_module()
class PairedImageDataset(BaseDataset):
    """HR images paired with LR images (from files or made on the fly).

    Args:
        data_root (str): root of ``gt_dir`` and ``lr_dir``.
        gt_dir (str): HR folder, relative to ``data_root``.
        scale (int): SR scale factor.
        lr_dir (str | None): LR folder relative to ``data_root`` (may contain
            ``{scale}``), or None for on-the-fly bicubic degradation.
        lr_filename_tmpl (str | Sequence[str]): LR file stem made from the HR
            stem, with ``{stem}`` and ``{scale}`` (``'{stem}x{scale}'`` for
            DIV2K/EDSR, ``'{stem}'`` for BasicSR's benchmark folders); with
            several, the first that names an existing file. Any image extension.
        dataset_name (str | None): reported with the metrics; default: the
            basename of ``data_root``.
        pipeline, test_mode, indices, serialize_data, lazy_init, max_refetch:
            see :class:`mmengine.dataset.BaseDataset`.

    Each sample: ``gt_path``, ``lr_path`` (or None), ``scale``,
    ``img_name`` (HR stem), ``dataset_name``.
    """

    METAINFO = dict(task='super-resolution')

    def __init__(self, data_root: str, gt_dir: str, scale: int, lr_dir: Optional[str] = None,
                 lr_filename_tmpl: Union[str, Sequence[str]] = '{stem}x{scale}', dataset_name: Optional[str] = None,
                 pipeline=(), test_mode: bool = False, **kwargs):
        if not isinstance(scale, int) or isinstance(scale, bool) or scale < 1:
            raise ValueError(f'scale must be a positive int, got {scale!r}')
        self.scale = scale
        self.gt_dir = gt_dir
        self.lr_dir = None if lr_dir is None else lr_dir.format(scale=scale)
        self.lr_filename_tmpl = ((lr_filename_tmpl, ) if isinstance(lr_filename_tmpl, str)
                                 else tuple(lr_filename_tmpl))
        self.dataset_name = dataset_name or osp.basename(osp.normpath(data_root))
        super().__init__(data_root=data_root, pipeline=list(pipeline), test_mode=test_mode, **kwargs)

    def load_data_list(self) -> List[dict]:
        gt_folder = osp.join(self.data_root, self.gt_dir)
        gt_files = _list_images(gt_folder)
        if not gt_files:
            raise FileNotFoundError(f'no images ({", ".join(IMG_EXTENSIONS)}) in {gt_folder}')
        lr_index = {}
        if self.lr_dir is not None:
            lr_folder = osp.join(self.data_root, self.lr_dir)
            lr_index = {osp.splitext(f)[0]: osp.join(lr_folder, f) for f in _list_images(lr_folder)}
        data_list = []
        for name in gt_files:
            stem = osp.splitext(name)[0]
            lr_path = None
            if self.lr_dir is not None:
                lr_stems = [t.format(stem=stem, scale=self.scale) for t in self.lr_filename_tmpl]
                found = [lr_index[s] for s in lr_stems if s in lr_index]
                if not found:
                    raise FileNotFoundError(
                        f'no LR image {" or ".join(s + ".*" for s in lr_stems)} in '
                        f'{osp.join(self.data_root, self.lr_dir)} for the HR image '
                        f'{osp.join(gt_folder, name)} (lr_filename_tmpl='
                        f'{" or ".join(map(repr, self.lr_filename_tmpl))})')
                lr_path = found[0]
            data_list.append(dict(gt_path=osp.join(gt_folder, name), lr_path=lr_path,
                                  scale=self.scale, img_name=stem,
                                  dataset_name=self.dataset_name))
        return data_list


# (HR folder, LR folder, LR file template); LR folder None: degrade on the fly
BENCHMARK_LAYOUTS = (
    ('HR', 'LR_bicubic/X{scale}', ('{stem}x{scale}', '{stem}_LRBI_x{scale}')),
    ('GTmod12', 'LRbicx{scale}', '{stem}'),
    ('HR', None, None),
    ('GTmod12', None, None),
    ('original', None, None),
    ('.', None, None),
)
BENCHMARK_NAMES = ('Set5', 'Set14', 'B100', 'Urban100', 'Manga109')


@DATASETS.register_module()
class SRBenchmarkDataset(PairedImageDataset):
    """One SR test set (Set5, Set14, B100, Urban100, Manga109, or any folder) in a usual layout.

    Args:
        name (str): folder of the set under ``data_root`` (also the reported name).
        scale (int): SR scale factor.
        data_root (str): folder holding the test sets. Default ``'data/benchmark'``.
        layout (str): ``'auto'`` (first of :data:`BENCHMARK_LAYOUTS` that
            exists), ``'edsr'``, ``'basicsr'`` or ``'hr_only'``.
        **kwargs: :class:`PairedImageDataset` arguments (``pipeline``, ...).
    """

    _LAYOUT_NAMES = dict(edsr=BENCHMARK_LAYOUTS[:1], basicsr=BENCHMARK_LAYOUTS[1:2],
                         hr_only=BENCHMARK_LAYOUTS[2:], auto=BENCHMARK_LAYOUTS)

    def __init__(self, name: str, scale: int, data_root: str = 'data/benchmark',
                 layout: str = 'auto', **kwargs):
        if layout not in self._LAYOUT_NAMES:
            raise ValueError(f'layout must be one of {tuple(self._LAYOUT_NAMES)}, got {layout!r}')
        set_root = osp.join(data_root, name)
        gt_dir, lr_dir, tmpl = self._find_layout(set_root, scale, self._LAYOUT_NAMES[layout])
        super().__init__(data_root=set_root, gt_dir=gt_dir, scale=scale, lr_dir=lr_dir,
                         lr_filename_tmpl=tmpl or '{stem}', dataset_name=name, **kwargs)

    @staticmethod
    def _find_layout(set_root: str, scale: int, layouts):
        for gt_dir, lr_dir, tmpl in layouts:
            gt_folder = osp.join(set_root, gt_dir)
            if not osp.isdir(gt_folder) or not _list_images(gt_folder):
                continue
            if lr_dir is None or osp.isdir(osp.join(set_root, lr_dir.format(scale=scale))):
                return gt_dir, lr_dir, tmpl
        raise FileNotFoundError(
            f'no SR test set layout found under {set_root} for x{scale}; expected one of: '
            + '; '.join(f'{gt}/ + {lr.format(scale=scale)}/' if lr else f'{gt}/ (HR only)'
                        for gt, lr, _ in layouts))
