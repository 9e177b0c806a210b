"""Gaussian diffusion: schedule, forward process, hybrid loss, DDPM/DDIM samplers.

Notation (``t = 0 .. T-1``)::

    q(x_t | x_0)       = N(sqrt(abar_t) x_0, (1 - abar_t) I),   abar_t = prod_{s<=t} (1 - beta_s)
    q(x_{t-1}|x_t,x_0) = N(c0_t x_0 + ct_t x_t, beta~_t I)
        beta~_t = beta_t (1 - abar_{t-1}) / (1 - abar_t)
        c0_t    = beta_t sqrt(abar_{t-1}) / (1 - abar_t)
        ct_t    = (1 - abar_{t-1}) sqrt(alpha_t) / (1 - abar_t)

The network predicts the noise ``eps`` and, with a learned variance, a value
``v in [-1, 1]`` interpolating the log-variance between ``log beta~_t`` and
``log beta_t`` ("learned range"). Training minimises the hybrid loss
``mse(eps) + L_vb`` where the variational term sees a detached ``eps`` so it
only trains the variance.

Schedules are computed in float64 and cast to the data's dtype when used.
A diffusion can be *respaced* to a subset of its timesteps
(:meth:`GaussianDiffusion.respace`): the new chain has the same ``abar`` at
the kept steps, and the network is still called with the original timesteps.
"""
import math
from typing import Callable, Dict, List, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

__all__ = [
    'GaussianDiffusion', 'linear_beta_schedule', 'space_timesteps', 'normal_kl',
    'discretized_gaussian_log_likelihood', 'randn_batch', 'ModelFn'
]

#: ``model_fn(x_t, t) -> (B, C or 2C, ...)``, ``t`` in the *original* schedule's steps.
ModelFn = Callable[[Tensor, Tensor], Tensor]
Generators = Union[None, torch.Generator, Sequence[torch.Generator]]


def linear_beta_schedule(num_timesteps: int = 1000) -> np.ndarray:
    """DDPM's linear betas, 1e-4 .. 0.02 for 1000 steps (scaled by ``1000 / T`` otherwise)."""
    if num_timesteps < 1:
        raise ValueError(f'num_timesteps must be >= 1, got {num_timesteps}')
    scale = 1000.0 / num_timesteps
    return np.linspace(scale * 1e-4, scale * 0.02, num_timesteps, dtype=np.float64)


def space_timesteps(num_timesteps: int, section_counts: Union[int, str, Sequence[int]]) -> List[int]:
    """Timesteps kept when respacing a ``num_timesteps`` chain.

    Args:
        section_counts: ``int`` n (n steps, evenly spread, first and last kept),
            ``'ddimN'`` (stride ``T // N`` from 0, as in DDIM), ``'a,b,c'`` or a
            list (the chain split into equal sections, each evenly respaced to
            its count).

    Returns:
        list[int]: sorted distinct timesteps.
    """
    if isinstance(section_counts, str):
        if section_counts.startswith('ddim'):
            target = int(section_counts[len('ddim'):])
            for stride in range(1, num_timesteps):
                if len(range(0, num_timesteps, stride)) == target:
                    return list(range(0, num_timesteps, stride))
            raise ValueError(f'cannot take exactly {target} equally strided steps of {num_timesteps}')
        section_counts = [int(x) for x in section_counts.split(',')]
    elif isinstance(section_counts, int):
        section_counts = [section_counts]
    sections = len(section_counts)
    base, extra = divmod(num_timesteps, sections)
    steps, start = [], 0
    for i, count in enumerate(section_counts):
        size = base + (1 if i < extra else 0)
        if not 1 <= count <= size:
            raise ValueError(f'cannot take {count} steps from a section of {size} timesteps '
                             f'(num_timesteps={num_timesteps})')
        stride = (size - 1) / (count - 1) if count > 1 else 1
        steps += [start + round(j * stride) for j in range(count)]
        start += size
    return sorted(set(steps))


def normal_kl(mean1: Tensor, logvar1: Tensor, mean2: Tensor, logvar2: Tensor) -> Tensor:
    """``KL(N(mean1, e^logvar1) || N(mean2, e^logvar2))`` elementwise (nats)."""
    return 0.5 * (-1.0 + logvar2 - logvar1 + torch.exp(logvar1 - logvar2)
                  + (mean1 - mean2) ** 2 * torch.exp(-logvar2))


def _standard_normal_cdf(x: Tensor) -> Tensor:
    return 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def discretized_gaussian_log_likelihood(x: Tensor, means: Tensor, log_scales: Tensor) -> Tensor:
    """Log-probability of data ``x`` in [-1, 1] quantised to 256 bins under N(means, e^(2 log_scales)).

    The outer bins extend to -inf / +inf, so probabilities of the 256 bins sum to one.
    """
    centered = x - means
    inv_std = torch.exp(-log_scales)
    cdf_plus = _standard_normal_cdf(inv_std * (centered + 1.0 / 255))
    cdf_minus = _standard_normal_cdf(inv_std * (centered - 1.0 / 255))
    log_cdf_plus = torch.log(cdf_plus.clamp(min=1e-12))
    log_one_minus_cdf_min = torch.log((1.0 - cdf_minus).clamp(min=1e-12))
    log_delta = torch.log((cdf_plus - cdf_minus).clamp(min=1e-12))
    return torch.where(x < -0.999, log_cdf_plus,
                       torch.where(x > 0.999, log_one_minus_cdf_min, log_delta))


def _mean_flat(x: Tensor) -> Tensor:
    return x.mean(dim=tuple(range(1, x.dim())))


def randn_batch(shape: Sequence[int], generator: Generators = None, device=None,
                dtype: torch.dtype = torch.float32) -> Tensor:
    """Standard normal noise of ``shape``.

    ``generator`` may be ``None`` (global RNG), one ``torch.Generator`` or one
    generator per sample (``len == shape[0]``, drawn on the CPU): the last
    makes every sample's noise independent of batch composition and process count.
    """
    if generator is None or isinstance(generator, torch.Generator):
        gen_device = generator.device if generator is not None else device
        noise = torch.randn(tuple(shape), generator=generator, device=gen_device, dtype=dtype)
        return noise if device is None else noise.to(device)
    generators = list(generator)
    if len(generators) != shape[0]:
        raise ValueError(f'need one generator per sample: {shape[0]}, got {len(generators)}')
    noise = torch.stack([torch.randn(tuple(shape[1:]), generator=g, dtype=dtype) for g in generators])
    return noise if device is None else noise.to(device)


class GaussianDiffusion:
    """A discrete Gaussian diffusion chain with epsilon prediction.

    Args:
        betas: ``(T,)`` noise schedule; default the 1000-step linear one.
        learn_sigma (bool): the model's output is ``[eps | v]`` (learned-range
            variance); otherwise just ``eps`` with the fixed posterior variance.
        timestep_map: original timestep of each step (set by :meth:`respace`).
    """

    def __init__(self, betas: Optional[Sequence[float]] = None, learn_sigma: bool = True,
                 timestep_map: Optional[Sequence[int]] = None):
        betas = linear_beta_schedule(1000) if betas is None else np.asarray(betas, dtype=np.float64)
        if betas.ndim != 1 or betas.size < 1 or not ((betas > 0) & (betas <= 1)).all():
            raise ValueError('betas must be a non-empty 1-D sequence in (0, 1]')
        self.learn_sigma = learn_sigma
        self.num_timesteps = int(betas.size)
        self.timestep_map = np.arange(self.num_timesteps) if timestep_map is None \
            else np.asarray(timestep_map, dtype=np.int64)
        if self.timestep_map.shape != betas.shape:
            raise ValueError('timestep_map must have one entry per beta')

        alphas = 1.0 - betas
        abar = np.cumprod(alphas)
        abar_prev = np.append(1.0, abar[:-1])
        self.betas = betas
        self.alphas_cumprod = abar
        self.alphas_cumprod_prev = abar_prev
        self.sqrt_alphas_cumprod = np.sqrt(abar)
        self.sqrt_one_minus_alphas_cumprod = np.sqrt(1.0 - abar)
        self.sqrt_recip_alphas_cumprod = np.sqrt(1.0 / abar)
        self.sqrt_recipm1_alphas_cumprod = np.sqrt(1.0 / abar - 1.0)
        self.posterior_variance = betas * (1.0 - abar_prev) / (1.0 - abar)
        # beta~_0 = 0: use beta~_1 for the log so the range stays finite
        self.posterior_log_variance_clipped = np.log(
            np.append(self.posterior_variance[1], self.posterior_variance[1:])
            if self.num_timesteps > 1 else betas)
        self.posterior_mean_coef1 = betas * np.sqrt(abar_prev) / (1.0 - abar)
        self.posterior_mean_coef2 = (1.0 - abar_prev) * np.sqrt(alphas) / (1.0 - abar)

    # ------------------------------------------------------------------ schedule
    @staticmethod
    def _extract(arr: np.ndarray, t: Tensor, like: Tensor) -> Tensor:
        """``arr[t]`` as ``(B, 1, ..., 1)`` in ``like``'s dtype and device."""
        values = torch.from_numpy(arr).to(device=t.device)[t].to(like.dtype)
        return values.reshape(-1, *([1] * (like.dim() - 1)))

    def respace(self, section_counts: Union[int, str, Sequence[int]]) -> 'GaussianDiffusion':
        """The chain restricted to :func:`space_timesteps` ``(T, section_counts)``."""
        keep = space_timesteps(self.num_timesteps, section_counts)
        betas, last = [], 1.0
        for i in keep:
            betas.append(1.0 - self.alphas_cumprod[i] / last)
            last = self.alphas_cumprod[i]
        return GaussianDiffusion(np.array(betas), self.learn_sigma, self.timestep_map[keep])

    def model_timesteps(self, t: Tensor) -> Tensor:
        """Chain steps ``t`` -> timesteps the network was trained with."""
        return torch.from_numpy(self.timestep_map).to(t.device)[t]

    # ----------------------------------------------------------- forward process
    def q_mean_variance(self, x_start: Tensor, t: Tensor):
        """Mean, variance and log-variance of ``q(x_t | x_0)``."""
        mean = self._extract(self.sqrt_alphas_cumprod, t, x_start) * x_start
        var = self._extract(1.0 - self.alphas_cumprod, t, x_start)
        log_var = self._extract(np.log(1.0 - self.alphas_cumprod), t, x_start)
        return mean, var, log_var

    def q_sample(self, x_start: Tensor, t: Tensor, noise: Optional[Tensor] = None) -> Tensor:
        """Draw ``x_t ~ q(x_t | x_0)``: ``sqrt(abar_t) x_0 + sqrt(1 - abar_t) noise``."""
        noise = torch.randn_like(x_start) if noise is None else noise
        return (self._extract(self.sqrt_alphas_cumprod, t, x_start) * x_start
                + self._extract(self.sqrt_one_minus_alphas_cumprod, t, x_start) * noise)

    def q_posterior_mean_variance(self, x_start: Tensor, x_t: Tensor, t: Tensor):
        """Mean, variance and clipped log-variance of ``q(x_{t-1} | x_t, x_0)``."""
        mean = (self._extract(self.posterior_mean_coef1, t, x_t) * x_start
                + self._extract(self.posterior_mean_coef2, t, x_t) * x_t)
        var = self._extract(self.posterior_variance, t, x_t)
        log_var = self._extract(self.posterior_log_variance_clipped, t, x_t)
        return mean, var, log_var

    def predict_xstart_from_eps(self, x_t: Tensor, t: Tensor, eps: Tensor) -> Tensor:
        return (self._extract(self.sqrt_recip_alphas_cumprod, t, x_t) * x_t
                - self._extract(self.sqrt_recipm1_alphas_cumprod, t, x_t) * eps)

    def predict_eps_from_xstart(self, x_t: Tensor, t: Tensor, x_start: Tensor) -> Tensor:
        return ((self._extract(self.sqrt_recip_alphas_cumprod, t, x_t) * x_t - x_start)
                / self._extract(self.sqrt_recipm1_alphas_cumprod, t, x_t))

    # ----------------------------------------------------------- reverse process
    def split_output(self, output: Tensor, x_t: Tensor):
        """Model output -> ``(eps, v)``; ``v`` is None without a learned variance."""
        channels = x_t.shape[1]
        expected = 2 * channels if self.learn_sigma else channels
        if output.shape[1] != expected or output.shape[2:] != x_t.shape[2:]:
            raise ValueError(f'model output must have {expected} channels and the spatial shape of '
                             f'x_t {tuple(x_t.shape[2:])}, got {tuple(output.shape)}')
        if self.learn_sigma:
            return output[:, :channels], output[:, channels:]
        return output, None

    def p_mean_variance(self, model_output: Tensor, x_t: Tensor, t: Tensor,
                        clip_denoised: bool = False) -> Dict[str, Tensor]:
        """``p(x_{t-1} | x_t)`` from a model output already computed at ``(x_t, t)``.

        Returns:
            dict: ``mean``, ``variance``, ``log_variance``, ``pred_xstart``, ``eps``.
        """
        eps, v = self.split_output(model_output, x_t)
        if v is None:
            log_var = self._extract(self.posterior_log_variance_clipped, t, x_t).expand_as(x_t)
        else:
            min_log = self._extract(self.posterior_log_variance_clipped, t, x_t)
            max_log = self._extract(np.log(self.betas), t, x_t)
            frac = (v + 1) / 2
            log_var = frac * max_log + (1 - frac) * min_log
        pred_xstart = self.predict_xstart_from_eps(x_t, t, eps)
        if clip_denoised:
            pred_xstart = pred_xstart.clamp(-1, 1)
        mean, _, _ = self.q_posterior_mean_variance(pred_xstart, x_t, t)
        return dict(mean=mean, variance=torch.exp(log_var), log_variance=log_var,
                    pred_xstart=pred_xstart, eps=eps)

    def _call(self, model_fn: ModelFn, x: Tensor, t: Tensor) -> Tensor:
        return model_fn(x, self.model_timesteps(t))

    # ------------------------------------------------------------------ training
    def vb_terms_bpd(self, model_output: Tensor, x_start: Tensor, x_t: Tensor,
                     t: Tensor) -> Tensor:
        """Per-sample variational-bound term in bits per dimension, ``(B,)``.

        ``KL(q(x_{t-1}|x_t,x_0) || p(x_{t-1}|x_t))`` for ``t > 0`` and the
        discretised decoder NLL ``-log p(x_0 | x_1)`` for ``t == 0``.
        """
        true_mean, _, true_log_var = self.q_posterior_mean_variance(x_start, x_t, t)
        out = self.p_mean_variance(model_output, x_t, t)
        kl = _mean_flat(normal_kl(true_mean, true_log_var, out['mean'], out['log_variance']))
        nll = -_mean_flat(discretized_gaussian_log_likelihood(
            x_start, out['mean'], 0.5 * out['log_variance']))
        return torch.where(t == 0, nll, kl) / math.log(2.0)

    def training_losses(self, model_fn: ModelFn, x_start: Tensor, t: Tensor,
                        noise: Optional[Tensor] = None) -> Dict[str, Tensor]:
        """Hybrid loss at timesteps ``t`` (chain steps), each term ``(B,)``.

        Returns:
            dict: ``mse`` (noise regression), ``vb`` (variational bound, only
            through the variance; zero without ``learn_sigma``), ``loss``.
        """
        noise = torch.randn_like(x_start) if noise is None else noise
        x_t = self.q_sample(x_start, t, noise)
        output = self._call(model_fn, x_t, t)
        eps, v = self.split_output(output, x_t)
        mse = _mean_flat((noise - eps) ** 2)
        if v is None:
            vb = torch.zeros_like(mse)
        else:
            frozen = torch.cat([eps.detach(), v], dim=1)  # the bound trains the variance only
            vb = self.vb_terms_bpd(frozen, x_start, x_t, t) * (self.num_timesteps / 1000.0)
        return dict(mse=mse, vb=vb, loss=mse + vb)

    # ------------------------------------------------------------------ sampling
    def p_sample(self, model_fn: ModelFn, x: Tensor, t: Tensor, noise: Tensor,
                 clip_denoised: bool = False) -> Dict[str, Tensor]:
        """One ancestral (DDPM) step ``x_t -> x_{t-1}`` (no noise at ``t == 0``)."""
        out = self.p_mean_variance(self._call(model_fn, x, t), x, t, clip_denoised)
        nonzero = (t != 0).to(x.dtype).reshape(-1, *([1] * (x.dim() - 1)))
        sample = out['mean'] + nonzero * torch.exp(0.5 * out['log_variance']) * noise
        return dict(sample=sample, pred_xstart=out['pred_xstart'])

    def ddim_sample(self, model_fn: ModelFn, x: Tensor, t: Tensor, noise: Optional[Tensor],
                    eta: float = 0.0, clip_denoised: bool = False) -> Dict[str, Tensor]:
        """One DDIM step; ``eta = 0`` is deterministic, ``eta = 1`` matches DDPM's variance."""
        out = self.p_mean_variance(self._call(model_fn, x, t), x, t, clip_denoised)
        eps = self.predict_eps_from_xstart(x, t, out['pred_xstart'])
        abar = self._extract(self.alphas_cumprod, t, x)
        abar_prev = self._extract(self.alphas_cumprod_prev, t, x)
        sigma = eta * torch.sqrt((1 - abar_prev) / (1 - abar)) * torch.sqrt(1 - abar / abar_prev)
        sample = out['pred_xstart'] * torch.sqrt(abar_prev) + torch.sqrt(
            (1 - abar_prev - sigma ** 2).clamp(min=0)) * eps
        if eta > 0:
            nonzero = (t != 0).to(x.dtype).reshape(-1, *([1] * (x.dim() - 1)))
            sample = sample + nonzero * sigma * noise
        return dict(sample=sample, pred_xstart=out['pred_xstart'])

    @torch.no_grad()
    def sample(self, model_fn: ModelFn, shape: Sequence[int], sampler: str = 'ddpm',
               eta: float = 0.0, generator: Generators = None, device=None,
               clip_denoised: bool = False, noise: Optional[Tensor] = None,
               progress: Optional[Callable[[int, int], None]] = None) -> Tensor:
        """Run the reverse chain from ``x_T ~ N(0, I)`` to ``x_0``.

        Args:
            model_fn: network (with guidance) called as ``model_fn(x, t_original)``.
            shape: ``(B, C, H, W)`` of the samples.
            sampler: ``'ddpm'`` (ancestral) or ``'ddim'``.
            eta: DDIM noise scale.
            generator: see :func:`randn_batch`; one per sample gives results
                independent of batching.
            noise: optional explicit ``x_T``.
            progress: called as ``progress(step_index, num_steps)``.

        Returns:
            Tensor: ``shape`` samples.
        """
        if sampler not in ('ddpm', 'ddim'):
            raise ValueError(f"sampler must be 'ddpm' or 'ddim', got {sampler!r}")
        if eta < 0:
            raise ValueError(f'eta must be >= 0, got {eta}')
        x = randn_batch(shape, generator, device) if noise is None else noise
        if device is not None:
            x = x.to(device)
        needs_noise = sampler == 'ddpm' or eta > 0
        for i, step in enumerate(reversed(range(self.num_timesteps))):
            t = torch.full((shape[0], ), step, device=x.device, dtype=torch.long)
            step_noise = randn_batch(shape, generator, x.device) if needs_noise else None
            if sampler == 'ddpm':
                x = self.p_sample(model_fn, x, t, step_noise, clip_denoised)['sample']
            else:
                x = self.ddim_sample(model_fn, x, t, step_noise, eta, clip_denoised)['sample']
            if progress is not None:
                progress(i + 1, self.num_timesteps)
        return x
