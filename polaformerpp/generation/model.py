"""mmengine model for class-conditional diffusion with a DiT: training and sampling.

Data flow::

    dataset item   dict(inputs=uint8 (3, H, W), data_samples=dict(gt_label=int, ...))
    preprocessor   dict(inputs=float (B, 3, H, W) in [-1, 1], data_samples=dict(labels=(B,)))
    mode='loss'    pixel space: x0 = images; latent space: x0 = VAE(images) * 0.18215
                   -> dict(loss_mse, loss_vb)          (hybrid loss, uniform timesteps)
    mode='predict' samples for the batch's labels -> [dict(fake_img=uint8 (3, H, W), gt_label)]
"""
from typing import Dict, List, Optional, Union

import torch
from mmengine.model import BaseDataPreprocessor, BaseModel
from mmengine.registry import MODELS
from torch import Tensor

from .diffusion import GaussianDiffusion, Generators, linear_beta_schedule
from .sampling import guided_model_fn, to_uint8
from .vae import VAE_HELP

__all__ = ['DiffusionDataPreprocessor', 'DiTDiffusion']

SPACES = ('pixel', 'latent')


class _Shared:
    """Holds an object outside the module tree; copies of the model (EMA) share it."""

    def __init__(self, obj):
        self.obj = obj

    def __deepcopy__(self, memo):
        return self


@MODELS.register_module()
class DiffusionDataPreprocessor(BaseDataPreprocessor):
    """Stack uint8 images into ``[-1, 1]`` floats and gather the class labels."""

    def forward(self, data: dict, training: bool = False) -> dict:
        """Items without ``inputs`` (labels only, for sampling) give ``inputs=None``."""
        images = data.get('inputs')
        if isinstance(images, (list, tuple)):
            images = torch.stack(list(images))
        if images is not None:
            if images.dim() != 4 or images.shape[1] != 3:
                raise ValueError(f'inputs must be RGB images (B, 3, H, W), got {tuple(images.shape)}')
            if images.dtype != torch.uint8:
                raise TypeError(f'inputs must be uint8 images in [0, 255], got {images.dtype}')
        samples = data.get('data_samples')
        if isinstance(samples, dict):
            labels = samples.get('gt_label')
        elif isinstance(samples, (list, tuple)):
            labels = [s['gt_label'] for s in samples]
        else:
            labels = None
        if labels is None:
            raise ValueError("data_samples must hold the class labels as 'gt_label'")
        labels = torch.as_tensor(labels, dtype=torch.long).reshape(-1)
        if images is not None:
            images = self.cast_data(images).float() / 127.5 - 1.0
        return dict(inputs=images, data_samples=dict(labels=self.cast_data(labels)))


@MODELS.register_module()
class DiTDiffusion(BaseModel):
    """Class-conditional Gaussian diffusion with a DiT noise predictor.

    Args:
        dit (dict): DiT config, e.g. ``dict(type='DiT-S/2', input_size=32,
            in_channels=4, num_classes=1000)`` (``attn_type='softmax'`` for the baseline).
        space (str): ``'pixel'`` (diffusion on the RGB images) or ``'latent'``
            (on SD-VAE latents; needs ``vae``).
        vae (dict, optional): ``dict(type='SDVAE', path=...)`` for latent space
            (its weights are read on first use, so the model builds without them).
        num_timesteps (int): training chain length (linear betas).
        sample_cfg (dict): defaults for :meth:`sample` in ``predict`` mode:
            ``num_steps``, ``sampler`` ('ddpm'/'ddim'), ``cfg_scale``, ``cfg_channels``
            (guided output channels, None: all noise channels), ``eta``,
            ``clip_denoised`` (default: True in pixel space, False in latent space).
        allow_tf32 (bool, optional): set PyTorch's TF32 switches for CUDA matmuls and
            cuDNN when the model is built (``None``: leave them as they are).
    """

    def __init__(self, dit: dict, space: str = 'pixel', vae: Optional[dict] = None,
                 num_timesteps: int = 1000, sample_cfg: Optional[dict] = None,
                 allow_tf32: Optional[bool] = None,
                 data_preprocessor: Optional[dict] = None, init_cfg: Optional[dict] = None):
        if data_preprocessor is None:
            data_preprocessor = dict(type='DiffusionDataPreprocessor')
        super().__init__(data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        if space not in SPACES:
            raise ValueError(f'space must be one of {SPACES}, got {space!r}')
        self.space = space
        if allow_tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32 = bool(allow_tf32)
            torch.backends.cudnn.allow_tf32 = bool(allow_tf32)
        self.dit = MODELS.build(dit) if isinstance(dit, dict) else dit
        if space == 'latent':
            if vae is None or not vae.get('path'):
                raise ValueError(f"space='latent' needs model.vae=dict(type='SDVAE', path=...). "
                                 f'{VAE_HELP}')
            # kept out of the module tree: frozen, not checkpointed, not copied by EMA
            self._vae = _Shared(MODELS.build(vae))
        else:
            if vae is not None:
                raise ValueError("vae is only used with space='latent'")
            if self.dit.in_channels != 3:
                raise ValueError(f"space='pixel' needs a DiT with in_channels=3, "
                                 f'got {self.dit.in_channels}')
            self._vae = _Shared(None)
        self.diffusion = GaussianDiffusion(linear_beta_schedule(num_timesteps),
                                           learn_sigma=self.dit.learn_sigma)
        self.sample_cfg = dict(num_steps=250, sampler='ddpm', cfg_scale=1.0, cfg_channels=None,
                               eta=0.0, clip_denoised=space == 'pixel')
        self.sample_cfg.update(sample_cfg or {})
        self._respaced: Dict[int, GaussianDiffusion] = {}

    # ------------------------------------------------------------------ helpers
    @property
    def vae(self):
        """The frozen :class:`~polaformerpp.generation.SDVAE` (latent space) or None."""
        return self._vae.obj

    def _vae_on(self, device):
        param = next(iter(self.vae.parameters()), None)
        if param is not None and param.device != device:
            self.vae.to(device)
        return self.vae

    def encode(self, images: Tensor) -> Tensor:
        """Images in [-1, 1] -> the diffusion's data space (latents or the images)."""
        if self.space == 'latent':
            return self._vae_on(images.device).encode(images)
        return images

    def decode(self, x: Tensor) -> Tensor:
        """The diffusion's data space -> images in about [-1, 1]."""
        if self.space == 'latent':
            return self._vae_on(x.device).decode(x)
        return x

    def sampling_diffusion(self, num_steps: int) -> GaussianDiffusion:
        """The training chain respaced to ``num_steps`` (cached)."""
        T = self.diffusion.num_timesteps
        if not 1 <= num_steps <= T:
            raise ValueError(f'num_steps must be in [1, {T}], got {num_steps}')
        if num_steps == T:
            return self.diffusion
        if num_steps not in self._respaced:
            self._respaced[num_steps] = self.diffusion.respace(num_steps)
        return self._respaced[num_steps]

    def _check_labels(self, labels: Tensor) -> None:
        if labels.dim() != 1:
            raise ValueError(f'labels must be 1-D (B,), got shape {tuple(labels.shape)}')
        n = self.dit.num_classes
        if labels.numel() and (labels.min() < 0 or labels.max() >= n):
            raise ValueError(f'class labels must be in [0, {n - 1}], got min {int(labels.min())} '
                             f'max {int(labels.max())}')

    # ---------------------------------------------------------------- sampling
    @torch.no_grad()
    def sample(self, labels: Union[Tensor, List[int]], num_steps: Optional[int] = None,
               sampler: Optional[str] = None, cfg_scale: Optional[float] = None,
               eta: Optional[float] = None, clip_denoised: Optional[bool] = None,
               generator: Generators = None, progress=None,
               cfg_channels: Optional[int] = None) -> Tensor:
        """Generate one image per label.

        Args:
            labels: ``(B,)`` class labels.
            num_steps, sampler, cfg_scale, eta, clip_denoised, cfg_channels: override ``sample_cfg``.
            generator: ``None``, a ``torch.Generator`` or one per sample.

        Returns:
            Tensor: uint8 ``(B, 3, H, W)`` images on the CPU.
        """
        cfg = dict(self.sample_cfg)
        for key, value in dict(num_steps=num_steps, sampler=sampler, cfg_scale=cfg_scale, eta=eta,
                               clip_denoised=clip_denoised, cfg_channels=cfg_channels).items():
            if value is not None:
                cfg[key] = value
        device = next(self.dit.parameters()).device
        labels = torch.as_tensor(labels, dtype=torch.long, device=device)
        self._check_labels(labels)
        if self.space == 'latent' and hasattr(self.vae, 'load'):
            self.vae.load()  # a lazily loaded VAE: fail before sampling, not after it
        diffusion = self.sampling_diffusion(int(cfg['num_steps']))
        shape = (labels.shape[0], self.dit.in_channels, *self.dit.input_size)
        was_training = self.dit.training
        self.dit.eval()
        try:
            model_fn = guided_model_fn(self.dit, labels, float(cfg['cfg_scale']), cfg['cfg_channels'])
            x = diffusion.sample(model_fn, shape,
                                 sampler=cfg['sampler'], eta=float(cfg['eta']), generator=generator,
                                 device=device, clip_denoised=bool(cfg['clip_denoised']),
                                 progress=progress)
        finally:
            self.dit.train(was_training)
        return to_uint8(self.decode(x)).cpu()

    # ------------------------------------------------------------------ forward
    def forward(self, inputs: Tensor, data_samples: Optional[dict] = None, mode: str = 'tensor'):
        """``'loss'`` -> dict of losses, ``'predict'`` -> samples, ``'tensor'`` -> raw output."""
        if data_samples is None or 'labels' not in data_samples:
            raise ValueError('data_samples must be dict(labels=(B,) tensor), '
                             'as DiffusionDataPreprocessor makes it')
        labels = data_samples['labels']
        self._check_labels(labels)
        if mode == 'predict':
            fakes = self.sample(labels)
            return [dict(fake_img=img, gt_label=int(label)) for img, label in zip(fakes, labels)]
        x_start = self.encode(inputs)
        t = torch.randint(0, self.diffusion.num_timesteps, (x_start.shape[0], ), device=x_start.device)

        def model_fn(x, timesteps):
            return self.dit(x, timesteps, labels)

        if mode == 'loss':
            terms = self.diffusion.training_losses(model_fn, x_start, t)
            return dict(loss_mse=terms['mse'].mean(), loss_vb=terms['vb'].mean())
        if mode == 'tensor':
            return model_fn(self.diffusion.q_sample(x_start, t), t)
        raise ValueError(f"mode must be 'loss', 'predict' or 'tensor', got {mode!r}")
