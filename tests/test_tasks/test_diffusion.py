"""Gaussian diffusion maths, respacing and samplers, classifier-free guidance, and the
trainable DiTDiffusion model (pixel and latent space)."""
import math

import numpy as np
import pytest
import torch
from mmengine.registry import MODELS

from generation_testing import TINY_ARCH, tiny_model
from polaformerpp.generation import (
    DiffusionDataPreprocessor,
    DiTDiffusion,
    GaussianDiffusion,
    discretized_gaussian_log_likelihood,
    guided_model_fn,
    linear_beta_schedule,
    normal_kl,
    sample_generators,
    space_timesteps,
)


def test_classifier_free_guidance_combination():
    class FakeNet(torch.nn.Module):
        null_class = 9

        def forward(self, x, t, y):  # eps = label value, variance channels = label + 100
            v = y.float().reshape(-1, 1, 1, 1).expand_as(x)
            return torch.cat([v, v + 100], dim=1)

    x, t = torch.zeros(2, 3, 4, 4), torch.zeros(2, dtype=torch.long)
    out = guided_model_fn(FakeNet(), torch.tensor([1, 2]), cfg_scale=4.0)(x, t)
    eps_expected = 9 + 4.0 * (torch.tensor([1.0, 2.0]) - 9)
    torch.testing.assert_close(out[:, :3, 0, 0], eps_expected[:, None].expand(2, 3))
    torch.testing.assert_close(out[:, 3:, 0, 0], torch.tensor([[101.0] * 3, [102.0] * 3]))
    plain = guided_model_fn(FakeNet(), torch.tensor([1, 2]), cfg_scale=1.0)(x, t)
    assert plain[:, :3, 0, 0].tolist() == [[1.0] * 3, [2.0] * 3]
    with pytest.raises(ValueError, match='cfg_scale'):
        guided_model_fn(FakeNet(), torch.tensor([1]), cfg_scale=0.5)
    # latents: all four noise channels are guided (not DiT's first three only)
    latent = guided_model_fn(FakeNet(), torch.tensor([1, 2]), cfg_scale=4.0)(torch.zeros(2, 4, 4, 4), t)
    torch.testing.assert_close(latent[:, :4, 0, 0], eps_expected[:, None].expand(2, 4))
    torch.testing.assert_close(latent[:, 4:, 0, 0], torch.tensor([[101.0] * 4, [102.0] * 4]))
    # channels=3, DiT's released sampler: the 4th noise channel and the variance stay conditional
    dit3 = guided_model_fn(FakeNet(), torch.tensor([1, 2]), 4.0, channels=3)(torch.zeros(2, 4, 4, 4), t)
    torch.testing.assert_close(dit3[:, :3, 0, 0], eps_expected[:, None].expand(2, 3))
    torch.testing.assert_close(dit3[:, 3:, 0, 0], torch.tensor([[1.0] + [101.0] * 4, [2.0] + [102.0] * 4]))



def test_linear_schedule():
    betas = linear_beta_schedule(1000)
    assert betas.shape == (1000, ) and betas[0] == pytest.approx(1e-4) and betas[-1] == 0.02
    d = GaussianDiffusion()
    np.testing.assert_allclose(d.alphas_cumprod, np.cumprod(1 - betas))
    assert d.alphas_cumprod[-1] < 1e-4  # x_T is essentially pure noise


def test_q_sample_closed_form():
    d = GaussianDiffusion()
    x0 = torch.randn(4, 3, 2, 2, dtype=torch.float64)
    noise = torch.randn(4, 3, 2, 2, dtype=torch.float64)
    t = torch.tensor([0, 1, 500, 999])
    abar = torch.tensor([np.prod(1 - d.betas[:s + 1]) for s in t.tolist()]).reshape(-1, 1, 1, 1)
    torch.testing.assert_close(d.q_sample(x0, t, noise), abar.sqrt() * x0 + (1 - abar).sqrt() * noise)
    mean, var, log_var = d.q_mean_variance(x0, t)
    torch.testing.assert_close(mean, abar.sqrt() * x0)
    torch.testing.assert_close(var.expand_as(x0), (1 - abar).expand_as(x0))
    torch.testing.assert_close(log_var, torch.log(1 - abar))
    # eps <-> x0 inversion
    x_t = d.q_sample(x0, t, noise)
    torch.testing.assert_close(d.predict_xstart_from_eps(x_t, t, noise), x0)
    torch.testing.assert_close(d.predict_eps_from_xstart(x_t, t, x0)[1:], noise[1:])


def test_posterior_is_the_gaussian_product():
    """q(x_{t-1}|x_t,x_0) ∝ N(x_{t-1}; sqrt(abar_{t-1}) x0, 1 - abar_{t-1})
    * N(x_t; sqrt(alpha_t) x_{t-1}, beta_t), a product of Gaussians in x_{t-1}."""
    d = GaussianDiffusion()
    x0, x_t = torch.randn(3, 2, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)
    t = torch.tensor([1, 300, 999])
    mean, var, log_var = d.q_posterior_mean_variance(x0, x_t, t)
    beta = torch.tensor(d.betas[t.numpy()])[:, None]
    abar_prev = torch.tensor(d.alphas_cumprod[t.numpy() - 1])[:, None]
    precision = 1 / (1 - abar_prev) + (1 - beta) / beta
    expected_mean = (abar_prev.sqrt() * x0 / (1 - abar_prev)
                     + (1 - beta).sqrt() * x_t / beta) / precision
    torch.testing.assert_close(mean, expected_mean)
    torch.testing.assert_close(var, 1 / precision)
    torch.testing.assert_close(log_var, torch.log(1 / precision))
    # t = 0: the variance is 0; its log is clipped to that of t = 1
    _, var0, log_var0 = d.q_posterior_mean_variance(x0, x_t, torch.zeros(3, dtype=torch.long))
    assert float(var0.max()) == 0.0
    assert float(log_var0[0]) == pytest.approx(math.log(d.posterior_variance[1]))


def test_learned_range_variance_and_kl():
    d = GaussianDiffusion()
    x_t, t = torch.randn(2, 3, 2, 2, dtype=torch.float64), torch.tensor([5, 700])
    eps = torch.randn_like(x_t)
    bounds = ((-1.0, np.log(d.posterior_variance[t.numpy()])), (1.0, np.log(d.betas[t.numpy()])))
    for v, expected in bounds:
        out = d.p_mean_variance(torch.cat([eps, torch.full_like(x_t, v)], 1), x_t, t)
        torch.testing.assert_close(out['log_variance'][:, 0, 0, 0], torch.tensor(expected))
    a = torch.distributions.Normal(torch.tensor(0.3), torch.tensor(0.7))
    b = torch.distributions.Normal(torch.tensor(-0.2), torch.tensor(1.3))
    kl = normal_kl(a.mean, 2 * a.stddev.log(), b.mean, 2 * b.stddev.log())
    torch.testing.assert_close(kl, torch.distributions.kl_divergence(a, b))


def test_discretized_likelihood_sums_to_one():
    bins = torch.linspace(-1, 1, 256, dtype=torch.float64)
    log_p = discretized_gaussian_log_likelihood(bins, torch.full_like(bins, 0.1),
                                                torch.full_like(bins, math.log(0.3)))
    assert float(log_p.exp().sum()) == pytest.approx(1.0, abs=1e-6)


def test_training_losses_with_an_oracle():
    d = GaussianDiffusion()
    x0, noise = torch.rand(4, 3, 4, 4) * 2 - 1, torch.randn(4, 3, 4, 4)

    def oracle(x, t):  # the true noise and v = -1 (the posterior variance)
        return torch.cat([noise, -torch.ones_like(noise)], 1)

    losses = d.training_losses(oracle, x0, torch.tensor([0, 3, 400, 999]), noise)
    assert set(losses) == {'mse', 'vb', 'loss'} and losses['loss'].shape == (4, )
    assert float(losses['mse'].max()) < 1e-10
    assert float(losses['vb'][1:].abs().max()) < 1e-6  # exact posterior -> KL 0
    assert float(losses['vb'][0]) > 0  # decoder NLL in bits
    torch.testing.assert_close(losses['loss'], losses['mse'] + losses['vb'])


def test_space_timesteps():
    steps = space_timesteps(1000, 250)
    assert len(steps) == 250 and steps[0] == 0 and steps[-1] == 999
    assert space_timesteps(1000, 'ddim50') == list(range(0, 1000, 20))
    sections = space_timesteps(100, '10,5')
    assert len(sections) == 15 and max(s for s in sections if s < 50) == 49 and sections[-1] == 99
    assert space_timesteps(1000, 1000) == list(range(1000))
    with pytest.raises(ValueError, match='cannot take'):
        space_timesteps(10, 11)


def test_respaced_schedule_is_consistent():
    base = GaussianDiffusion()
    spaced = base.respace(250)
    keep = space_timesteps(1000, 250)
    assert spaced.num_timesteps == 250 and spaced.timestep_map.tolist() == keep
    np.testing.assert_allclose(spaced.alphas_cumprod, base.alphas_cumprod[keep], rtol=1e-12)
    x0, noise = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    # the same marginal q(x_t | x_0) at the kept steps
    torch.testing.assert_close(spaced.q_sample(x0, torch.tensor([10, 249]), noise),
                               base.q_sample(x0, torch.tensor([keep[10], 999]), noise))
    assert spaced.model_timesteps(torch.tensor([0, 1, 249])).tolist() == [0, keep[1], 999]
    full = base.respace(1000)
    np.testing.assert_allclose(full.betas, base.betas, rtol=1e-10)


@pytest.mark.parametrize('sampler', ['ddpm', 'ddim'])
@pytest.mark.parametrize('steps', [1000, 20])
def test_samplers_recover_a_point_mass(sampler, steps):
    """With the exact noise predictor of a one-point data set, sampling returns that point."""
    base = GaussianDiffusion()
    diffusion = base if steps == 1000 else base.respace(steps)
    x0 = torch.rand(2, 3, 2, 2) * 2 - 1
    seen = set()

    def oracle(x, t):  # called with the *original* timesteps
        seen.update(t.tolist())
        abar = torch.from_numpy(base.alphas_cumprod)[t].float().reshape(-1, 1, 1, 1)
        eps = (x - abar.sqrt() * x0) / (1 - abar).sqrt()
        return torch.cat([eps, torch.zeros_like(eps)], 1)

    out = diffusion.sample(oracle, x0.shape, sampler=sampler, generator=torch.Generator().manual_seed(0))
    assert (out - x0).abs().max() < 1e-4
    assert seen == set(diffusion.timestep_map.tolist())



def test_dit_diffusion_loss_predict_and_determinism():
    model = tiny_model()
    pre = DiffusionDataPreprocessor()
    batch = dict(inputs=[torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8) for _ in range(4)],
                 data_samples=dict(gt_label=[0, 1, 2, 3]))
    data = pre(batch, training=True)
    assert data['inputs'].min() >= -1 and data['inputs'].max() <= 1
    model.train()
    losses = model(**data, mode='loss')
    assert set(losses) == {'loss_mse', 'loss_vb'} and all(torch.isfinite(v) for v in losses.values())
    model.eval()
    outs = model(**data, mode='predict')
    assert len(outs) == 4 and outs[0]['fake_img'].shape == (3, 8, 8)
    assert outs[0]['fake_img'].dtype == torch.uint8 and outs[2]['gt_label'] == 2

    labels = torch.tensor([0, 1, 2, 3])
    a = model.sample(labels, generator=sample_generators(7, range(4)))
    b = model.sample(labels, generator=sample_generators(7, range(4)))
    assert torch.equal(a, b)  # fixed seed: identical
    split = torch.cat([model.sample(labels[:2], generator=sample_generators(7, [0, 1])),
                       model.sample(labels[2:], generator=sample_generators(7, [2, 3]))])
    assert (split.int() - a.int()).abs().max() <= 1  # independent of batching
    other = model.sample(torch.tensor([1, 2, 3, 0]), generator=sample_generators(7, range(4)))
    assert (other.float() - a.float()).abs().mean() > 1.0  # the class changes the sample
    c = model.sample(labels, generator=sample_generators(8, range(4)))
    assert not torch.equal(a, c)
    guided = model.sample(labels, cfg_scale=3.0, sampler='ddpm', num_steps=2,
                          generator=sample_generators(7, range(4)))
    assert guided.shape == (4, 3, 8, 8)


@MODELS.register_module(name='ToyVAEForTests', force=True)
class ToyVAE(torch.nn.Module):
    """Stands in for the SD VAE: 8x average pooling to 4 channels and back."""

    def __init__(self, path, scale_factor=0.5):
        super().__init__()
        self.scale_factor = scale_factor
        self.calls = []

    def encode(self, images):
        self.calls.append('encode')
        pooled = torch.nn.functional.avg_pool2d(images, 8)
        return torch.cat([pooled, pooled.mean(1, keepdim=True)], 1) * self.scale_factor

    def decode(self, latents):
        self.calls.append('decode')
        return torch.nn.functional.interpolate(latents[:, :3] / self.scale_factor, scale_factor=8)


def test_latent_space_goes_through_the_vae():
    model = DiTDiffusion(dit=dict(type='DiT', arch=TINY_ARCH, input_size=4, in_channels=4,
                                  num_classes=4),
                         space='latent', vae=dict(type='ToyVAEForTests', path='unused'),
                         sample_cfg=dict(num_steps=2))
    assert isinstance(model.vae, ToyVAE)
    assert not any(k.startswith('vae') or '_vae' in k for k in model.state_dict())
    import copy
    assert copy.deepcopy(model).vae is model.vae  # EMA copies share the frozen VAE
    images = torch.rand(2, 3, 32, 32) * 2 - 1
    losses = model(images, dict(labels=torch.tensor([0, 1])), mode='loss')
    assert torch.isfinite(sum(losses.values()))
    samples = model.sample(torch.tensor([2, 3]))
    assert samples.shape == (2, 3, 32, 32) and samples.dtype == torch.uint8
    assert model.vae.calls == ['encode', 'decode']


@pytest.mark.parametrize('attn_type', ['linear', 'softmax'])
def test_a_few_steps_reduce_the_loss(attn_type):
    torch.manual_seed(0)
    model = DiTDiffusion(dit=dict(type='DiT', arch=TINY_ARCH, input_size=8, in_channels=3,
                                  num_classes=2, attn_type=attn_type))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x0 = torch.zeros(16, 3, 8, 8)
    x0[:8, :, :4] = 1.0
    x0[8:, :, 4:] = -1.0
    labels = dict(labels=torch.tensor([0] * 8 + [1] * 8))
    history = []
    for _ in range(30):
        loss = sum(model(x0, labels, mode='loss').values())
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(float(loss))
    assert np.mean(history[-5:]) < 0.7 * np.mean(history[:5]), history



def test_diffusion_bad_inputs_get_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="space='latent' needs model.vae.*sd-vae-ft-ema"):
        DiTDiffusion(dit=dict(type='DiT-S/2', input_size=32), space='latent')
    latent = DiTDiffusion(dit=dict(type='DiT-S/2', input_size=32), space='latent',
                          vae=dict(type='SDVAE', path=str(tmp_path / 'no-vae')))
    with pytest.raises(FileNotFoundError, match='not found'):
        latent.sample(torch.tensor([0]), num_steps=1)  # the weights are read on first use
    with pytest.raises(ValueError, match='in_channels=3'):
        DiTDiffusion(dit=dict(type='DiT-S/2', input_size=32), space='pixel')
    model = tiny_model()
    with pytest.raises(ValueError, match=r'class labels must be in \[0, 3\]'):
        model.sample(torch.tensor([0, 4]))
    with pytest.raises(ValueError, match='num_steps must be in'):
        model.sample(torch.tensor([0]), num_steps=0)
    with pytest.raises(ValueError, match="sampler must be 'ddpm' or 'ddim'"):
        model.sample(torch.tensor([0]), sampler='euler')
    with pytest.raises(ValueError, match='betas'):
        GaussianDiffusion(betas=[0.1, 1.5])
