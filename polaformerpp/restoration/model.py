"""mmengine model wrapper for SR training/testing and its data preprocessor.

Data flow (see :mod:`.transforms`)::

    dataset sample: inputs = LR uint8 (3, h, w), data_samples = SRDataSample(gt_img uint8 (3, sh, sw))
    SRDataPreprocessor: stack, /255, - DIV2K RGB mean        -> (B, 3, h, w) float
    SRRestorer 'loss':    L1(network(x) + mean, gt / 255)   -> {'loss': ...}
    SRRestorer 'predict': clamp(network(x) + mean, 0, 1), rounded to uint8 -> data_sample.pred_img

With ``pad_to_window=True`` every network call sees its input mirror-padded
at the bottom/right to a multiple of the network's window size (the output is
cropped back); with ``tile`` set, 'predict' runs the network on overlapping
parts of the image (:func:`tile_boxes`) and assembles their centres.
"""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from mmengine.model import BaseDataPreprocessor, BaseModel
from mmengine.registry import MODELS
from mmengine.structures import BaseDataElement
from torch import Tensor

__all__ = ['DIV2K_RGB_MEAN', 'SRDataPreprocessor', 'SRRestorer', 'mirror_pad', 'tile_boxes']

DIV2K_RGB_MEAN = (0.4488, 0.4371, 0.4040)


@MODELS.register_module()
class SRDataPreprocessor(BaseDataPreprocessor):
    """Stack LR images, scale to [0, 1] and subtract the RGB mean.

    Args:
        mean (Sequence[float]): per-channel mean in [0, 1] units (DIV2K's by default).
        pixel_range (float): the value of white in the input tensors (255 for uint8).
    """

    def __init__(self, mean: Sequence[float] = DIV2K_RGB_MEAN, pixel_range: float = 255.0):
        super().__init__()
        self.register_buffer('mean', torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1),
                             persistent=False)
        self.pixel_range = float(pixel_range)

    def forward(self, data: dict, training: bool = False) -> dict:
        """``{'inputs': list of (C, h, w), 'data_samples': ...}`` -> ``inputs`` ``(B, C, h, w)`` float."""
        data = self.cast_data(data)
        inputs = data['inputs']
        if isinstance(inputs, (list, tuple)):
            shapes = {tuple(t.shape) for t in inputs}
            if len(shapes) > 1:
                raise ValueError(f'LR images of one batch must share a size, got {sorted(shapes)}; '
                                 f'use batch_size=1 for test sets with images of different sizes')
            inputs = torch.stack(list(inputs))
        if inputs.dim() != 4 or inputs.shape[1] != self.mean.shape[1]:
            raise ValueError(f'inputs must be (B, {self.mean.shape[1]}, h, w) images, got '
                             f'{tuple(inputs.shape)}')
        inputs = inputs.float() / self.pixel_range - self.mean
        return dict(inputs=inputs, data_samples=data.get('data_samples'))

    def destruct(self, outputs: Tensor) -> Tensor:
        """Undo the normalisation: network output -> [0, 1] scale (not clamped)."""
        return outputs + self.mean


def mirror_pad(x: Tensor, height: int, width: int) -> Tensor:
    """Extend ``(B, C, h, w)`` to ``(B, C, height, width)`` at the bottom/right by mirroring.

    The extension repeats the image flipped, edge row/column included
    (``x[h-1], x[h-2], ...``), and again as often as needed when the pad is
    larger than the image.
    """
    for dim, size in ((2, height), (3, width)):
        while x.shape[dim] < size:
            x = torch.cat([x, x.flip(dim)], dim)
        x = x.narrow(dim, 0, size)
    return x


def tile_boxes(size: int, split_size: int = 200, overlap_div: int = 10
               ) -> Tuple[int, List[Tuple[int, int, int]]]:
    """Partition one image side for tiled inference.

    The side is cut into ``n = size // split_size + 1`` equal parts of
    ``part = padded // n`` pixels, after a reflection pad of the side to
    ``padded``, the next multiple of ``n``. Each part is run with
    ``shave = part // overlap_div`` pixels of context on its inner sides.

    Returns:
        ``(padded, boxes)``; each box is ``(start, stop, offset)``: the input
        rows ``[start, stop)`` of the padded image, whose output rows from
        ``offset`` (times the scale) on, ``part`` of them, fill the part.
    """
    n = size // split_size + 1
    padded = -(-size // n) * n
    part = padded // n
    shave = part // overlap_div
    boxes = []
    for i in range(n):
        start = i * part - (shave if i > 0 else 0)
        stop = (i + 1) * part + (shave if i < n - 1 else 0)
        boxes.append((start, stop, i * part - start))
    return padded, boxes


@MODELS.register_module()
class SRRestorer(BaseModel):
    """Trains and runs an SR network with an L1 pixel loss.

    Args:
        network (dict | nn.Module): the SR network (e.g. ``type='PolaPPSRLight'``),
            mapping normalised LR ``(B, 3, h, w)`` to normalised SR ``(B, 3, sh, sw)``.
        data_preprocessor (dict): defaults to :class:`SRDataPreprocessor`.
        pad_to_window (bool): mirror-pad every network input at the bottom/right
            to a multiple of ``network.window_size`` (:func:`mirror_pad`) and
            crop the output back.
        tile (dict | None): ``dict(split_size=200, overlap_div=10)`` makes
            'predict' run on overlapping parts (:func:`tile_boxes`) of each
            image; None runs on whole images.
        init_cfg: mmengine init config.
    """

    def __init__(self, network: Union[dict, torch.nn.Module],
                 data_preprocessor: Optional[dict] = None, pad_to_window: bool = False,
                 tile: Optional[dict] = None, init_cfg=None):
        if data_preprocessor is None:
            data_preprocessor = dict(type='SRDataPreprocessor')
        super().__init__(data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        self.network = MODELS.build(network) if isinstance(network, dict) else network
        self.scale = getattr(self.network, 'upscale', None)
        self.pad_multiple = getattr(self.network, 'window_size', 1) if pad_to_window else 1
        if tile is not None:
            tile = dict(tile)
            unknown = set(tile) - {'split_size', 'overlap_div'}
            if unknown or any(int(v) < 1 for v in tile.values()):
                raise ValueError(f'tile takes positive split_size and overlap_div, got {tile}')
            if self.scale is None:
                raise ValueError('tile needs a network with an upscale attribute')
        self.tile = tile

    def _run(self, x: Tensor) -> Tensor:
        """The network on ``x``, mirror-padded to the window multiple when asked."""
        h, w = x.shape[-2:]
        m = self.pad_multiple
        if m > 1 and (h % m or w % m):
            x = mirror_pad(x, -(-h // m) * m, -(-w // m) * m)
            out = self.network(x)
            s = out.shape[-1] // x.shape[-1] if self.scale is None else self.scale
            return out[..., :h * s, :w * s]
        return self.network(x)

    def _run_tiled(self, x: Tensor) -> Tensor:
        """The network on overlapping parts of ``x``, their centres put together."""
        h, w = x.shape[-2:]
        s = self.scale
        (height, rows), (width, cols) = (tile_boxes(n, **self.tile) for n in (h, w))
        x = F.pad(x, (0, width - w, 0, height - h), mode='reflect') if (height, width) != (h, w) else x
        part_h, part_w = height // len(rows), width // len(cols)
        out = x.new_zeros(x.shape[0], x.shape[1], height * s, width * s)
        for i, (top, bottom, dy) in enumerate(rows):
            for j, (left, right, dx) in enumerate(cols):
                y = self._run(x[..., top:bottom, left:right])
                out[..., i * part_h * s:(i + 1) * part_h * s, j * part_w * s:(j + 1) * part_w * s] = \
                    y[..., dy * s:(dy + part_h) * s, dx * s:(dx + part_w) * s]
        return out[..., :h * s, :w * s]

    def _check_scale(self, data_samples) -> None:
        for sample in data_samples or []:
            scale = sample.get('scale')
            if scale is not None and self.scale is not None and int(scale) != self.scale:
                raise ValueError(f'the data are for x{scale} super-resolution but the network was '
                                 f'built with upscale={self.scale}: set the dataset scale and '
                                 f'model.network.upscale to the same value')

    def _gt_batch(self, data_samples, like: Tensor) -> Tensor:
        if not data_samples or any(s.get('gt_img') is None for s in data_samples):
            raise ValueError("mode='loss' needs data_samples with a gt_img (the HR image)")
        gt = torch.stack([s.gt_img for s in data_samples]).to(like.device, torch.float32)
        gt = gt / self.data_preprocessor.pixel_range
        if gt.shape != like.shape:
            raise ValueError(f'HR images {tuple(gt.shape)} do not match the SR output '
                             f'{tuple(like.shape)} (HR size must be scale x LR size)')
        return gt

    def forward(self, inputs: Tensor, data_samples: Optional[List[BaseDataElement]] = None,
                mode: str = 'tensor') -> Union[Dict[str, Tensor], List[BaseDataElement], Tensor]:
        """``mode``: ``'loss'`` (dict), ``'predict'`` (data samples with ``pred_img``), ``'tensor'``.

        ``inputs``: normalised LR ``(B, 3, h, w)`` from :class:`SRDataPreprocessor`.
        """
        self._check_scale(data_samples)
        tiled = mode == 'predict' and self.tile is not None
        out = self._run_tiled(inputs) if tiled else self._run(inputs)
        if mode == 'tensor':
            return out
        sr = self.data_preprocessor.destruct(out)
        if mode == 'loss':
            return dict(loss=F.l1_loss(sr, self._gt_batch(data_samples, sr)))
        if mode == 'predict':
            pred = (sr.clamp(0, 1) * 255).round().to(torch.uint8).cpu()
            if data_samples is None:
                data_samples = [BaseDataElement() for _ in range(pred.shape[0])]
            for sample, img in zip(data_samples, pred):
                sample.pred_img = img
            return data_samples
        raise ValueError(f"mode must be 'loss', 'predict' or 'tensor', got {mode!r}")
