"""Class-conditional generation: DiT (PolaFormer++ / softmax attention), diffusion maths,
sampling, FID/IS, configs, tools; `slow`: a pixel-space run through tools/train.py,
sample.py (single process and torchrun with 2 CPU processes) and fid.py.
"""
import glob
import json
import math
import os
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DATASETS, METRICS, MODELS

from conftest import free_port, load_tool, run_tool
from polaformerpp.generation import (DIT_ARCHS, ClassImageFolder, DiffusionDataPreprocessor, DiT,
                                     DiTDiffusion, GaussianDiffusion, GenerationFID,
                                     InceptionV3Features, RandomConvFeatures,
                                     discretized_gaussian_log_likelihood, dit_param_count,
                                     feature_statistics, frechet_distance, guided_model_fn,
                                     inception_score, linear_beta_schedule, load_reference,
                                     normal_kl, sample_generators, space_timesteps)
from polaformerpp.generation.dit_layers import PolaTokenAttention, SoftmaxSelfAttention
from polaformerpp.models.layers import PolaLinearAttention

PIXEL_CONFIG = 'configs/generation/dit-tiny-4_polapp_1xb32-2k_demo-shapes-32.py'
LATENT_CONFIGS = {size: f'configs/generation/dit-{size}-2_polapp_8xb32-400k_in1k-256.py'
                  for size in ('s', 'b', 'l', 'xl')}
TINY_ARCH = dict(depth=2, hidden_size=32, num_heads=2, patch_size=2)


def tiny_dit(attn_type='pola', **kwargs):
    kwargs = dict(dict(input_size=8, in_channels=3, num_classes=4), **kwargs)
    return DiT(TINY_ARCH, attn_type=attn_type, **kwargs)


def randomize_(module, seed=0, std=0.2):
    """Overwrite every parameter (DiT zero-initialises adaLN and the output layer)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * std)
    return module


def tiny_model(attn_type='pola', **sample_cfg):
    model = DiTDiffusion(dit=dict(type='DiT', arch=TINY_ARCH, input_size=8, in_channels=3,
                                  num_classes=4, attn_type=attn_type),
                         sample_cfg=dict(dict(num_steps=3, sampler='ddim'), **sample_cfg))
    randomize_(model.dit)
    return model.eval()


# --------------------------------------------------------------------------- DiT
def test_names_are_registered_in_root_registries():
    for name in DIT_ARCHS:
        assert MODELS.get(name) is not None, name
    assert len(DIT_ARCHS) == 12
    for name in ('DiT', 'DiTDiffusion', 'DiffusionDataPreprocessor', 'SDVAE', 'InceptionV3Features',
                 'RandomConvFeatures'):
        assert MODELS.get(name) is not None, name
    assert DATASETS.get('ClassImageFolder') is ClassImageFolder
    assert METRICS.get('GenerationFID') is GenerationFID


@pytest.mark.parametrize('name', sorted(DIT_ARCHS))
def test_every_size_builds(name):
    with torch.device('meta'):
        net = MODELS.build(dict(type=name, input_size=32, in_channels=4, num_classes=1000))
    spec = DIT_ARCHS[name]
    assert len(net.blocks) == spec['depth'] and net.patch_size == spec['patch_size']
    assert isinstance(net.blocks[0].attn, PolaTokenAttention)
    assert net.grid == (32 // spec['patch_size'], ) * 2 and net.out_channels == 8
    count = sum(p.numel() for p in net.parameters()) + net.pos_embed.numel()
    assert count == dit_param_count(name, attn_type='pola')


PUBLISHED_PARAMS = {'DiT-S/2': 33e6, 'DiT-B/2': 130e6, 'DiT-L/2': 458e6, 'DiT-XL/2': 675e6}


@pytest.mark.parametrize('name', sorted(PUBLISHED_PARAMS))
def test_param_counts_match_published_dit(name):
    counts = {}
    for attn_type in ('softmax', 'pola'):
        with torch.device('meta'):
            net = DiT(name, input_size=32, in_channels=4, num_classes=1000, attn_type=attn_type)
        # the published numbers count the fixed position table (a frozen parameter there)
        counts[attn_type] = sum(p.numel() for p in net.parameters()) + net.pos_embed.numel()
        assert counts[attn_type] == dit_param_count(name, attn_type=attn_type)
    assert abs(counts['softmax'] / PUBLISHED_PARAMS[name] - 1) < 0.01, counts
    if name == 'DiT-XL/2':
        assert counts['softmax'] == 675_129_632
    # PolaFormer++ adds the gate (C*C + C), LePE (26C) and temperatures (4C) per block
    spec = DIT_ARCHS[name]
    C = spec['hidden_size']
    assert counts['pola'] - counts['softmax'] == spec['depth'] * (C * C + C + 26 * C + 4 * C)
    print(f"{name}: softmax {counts['softmax']:,}  pola {counts['pola']:,}")


@pytest.mark.parametrize('attn_type', ['pola', 'softmax'])
def test_tiny_dit_forward_zero_init_and_gradients(attn_type):
    net = tiny_dit(attn_type)
    x, t, y = torch.randn(3, 3, 8, 8), torch.tensor([0, 10, 999]), torch.tensor([0, 3, 4])
    out = net(x, t, y)
    assert out.shape == (3, 6, 8, 8)
    assert torch.count_nonzero(out) == 0  # adaLN-Zero and a zero output layer
    out.sum().backward()
    assert net.final_layer.linear.weight.grad.abs().sum() > 0
    attn_cls = PolaTokenAttention if attn_type == 'pola' else SoftmaxSelfAttention
    assert all(isinstance(b.attn, attn_cls) for b in net.blocks)
    randomize_(net)
    assert torch.isfinite(net(x, t, y)).all()


def test_pola_token_attention_is_the_grid_attention_without_rope():
    torch.manual_seed(0)
    attn = PolaTokenAttention(32, 2)
    assert isinstance(attn, PolaLinearAttention) and not attn.use_rope
    grid_attn = PolaLinearAttention(32, 2, use_rope=False)
    grid_attn.load_state_dict(attn.state_dict())
    x = torch.randn(2, 3 * 4, 32)
    expected = grid_attn(x.reshape(2, 3, 4, 32)).reshape(2, 12, 32)
    torch.testing.assert_close(attn(x, (3, 4)), expected)


def test_pos_embed_is_fixed_sincos():
    net = tiny_dit()
    assert 'pos_embed' in dict(net.named_buffers()) and 'pos_embed' in net.state_dict()
    pe = net.pos_embed[0]  # (16, 32): first half columns, second half rows, each [sin | cos]
    assert pe.shape == (16, 32)
    torch.testing.assert_close(pe[:, :8], torch.sin(pe[:, :8].asin()))
    torch.testing.assert_close(pe[1, :8], torch.sin(torch.ones(8) / 10000 ** (torch.arange(8) / 8)))
    torch.testing.assert_close(pe[4, 16:24], pe[1, :8])  # row 1 at col 0 == col 1 at row 0


def test_label_dropout_and_null_class():
    net = DiT(TINY_ARCH, input_size=8, in_channels=3, num_classes=4, class_dropout_prob=0.5)
    emb = net.y_embedder
    assert emb.embedding_table.num_embeddings == 5 and net.null_class == 4
    labels = torch.zeros(400, dtype=torch.long)
    emb.train()
    rows = emb(labels)
    is_null = (rows == emb.embedding_table.weight[4]).all(dim=1)
    assert 100 < int(is_null.sum()) < 300
    emb.eval()
    assert not (emb(labels) == emb.embedding_table.weight[4]).all(dim=1).any()
    no_cfg = DiT(TINY_ARCH, input_size=8, in_channels=3, num_classes=4, class_dropout_prob=0.0)
    assert no_cfg.y_embedder.embedding_table.num_embeddings == 4
    with pytest.raises(ValueError, match='class_dropout_prob > 0'):
        no_cfg.null_class


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


# --------------------------------------------------------------------- diffusion
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


# ------------------------------------------------------------- model / sampling
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


@pytest.mark.parametrize('attn_type', ['pola', 'softmax'])
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


# ------------------------------------------------------------------- FID and IS
def test_frechet_distance_closed_forms():
    rng = np.random.default_rng(0)
    mu1, mu2 = rng.normal(size=5), rng.normal(size=5)
    a, b = rng.uniform(0.1, 2, size=5), rng.uniform(0.1, 2, size=5)
    expected = np.sum((mu1 - mu2) ** 2) + np.sum(a + b - 2 * np.sqrt(a * b))
    assert frechet_distance(mu1, np.diag(a), mu2, np.diag(b)) == pytest.approx(expected, rel=1e-10)
    q, _ = np.linalg.qr(rng.normal(size=(5, 5)))  # commuting covariances with a shared basis
    assert frechet_distance(mu1, q @ np.diag(a) @ q.T, mu2, q @ np.diag(b) @ q.T) == \
        pytest.approx(expected, rel=1e-8)
    s = q @ np.diag(a) @ q.T
    assert frechet_distance(mu1, s, mu1, s) == pytest.approx(0.0, abs=1e-9)
    assert frechet_distance([1.0], [[4.0]], [3.0], [[9.0]]) == pytest.approx(4.0 + (2 - 3) ** 2)
    with pytest.raises(ValueError, match='same D'):
        frechet_distance(mu1, s, mu2[:4], s[:4, :4])
    with pytest.raises(ValueError, match='non-finite'):
        frechet_distance(mu1 * np.nan, s, mu2, s)


def test_fid_of_gaussian_samples_and_inception_score():
    rng = np.random.default_rng(1)
    f1, f2 = rng.normal(0, 1, (20000, 3)), rng.normal(0.5, 2, (20000, 3))
    fid = frechet_distance(*feature_statistics(f1), *feature_statistics(f2))
    assert fid == pytest.approx(3 * 0.25 + 3 * (1 + 4 - 2 * 2), rel=0.05)
    with pytest.raises(ValueError, match='N >= 2'):
        feature_statistics(f1[:1])
    assert inception_score(np.zeros((50, 10)), splits=5)[0] == pytest.approx(1.0)
    confident = np.eye(10)[np.arange(100) % 10] * 50.0
    assert inception_score(confident, splits=1)[0] == pytest.approx(10.0, rel=1e-3)


def test_generation_fid_metric_with_an_injected_extractor(tmp_path):
    metric = GenerationFID(feature_extractor=RandomConvFeatures(dim=16, seed=1), reference='batch')
    rng = np.random.default_rng(0)
    for _ in range(2):
        reals = [torch.from_numpy(rng.integers(0, 256, (3, 16, 16), dtype=np.uint8)) for _ in range(6)]
        fakes = [dict(fake_img=torch.from_numpy(rng.integers(0, 128, (3, 16, 16), dtype=np.uint8)),
                      gt_label=0) for _ in range(6)]
        metric.process(dict(inputs=reals), fakes)
    result = metric.compute_metrics(metric.results)
    assert np.isfinite(result['FID']) and result['FID'] > 0 and result['IS'] >= 1.0

    def stats_only(images):  # any callable with the extractor contract works
        return dict(pool=images.float().mean(dim=(2, 3)))

    ref = tmp_path / 'ref.npz'
    np.savez(ref, pool=rng.normal(size=(32, 3)))
    metric = GenerationFID(feature_extractor=stats_only, reference=str(ref))
    metric.process(dict(inputs=[]), fakes)
    result = metric.compute_metrics(metric.results)
    assert set(result) == {'FID'} and np.isfinite(result['FID'])
    loaded = load_reference(str(ref))
    assert loaded['mu'].shape == (3, ) and loaded['sigma'].shape == (3, 3)


# ----------------------------------------------------------------- data, configs
SHAPE_COLORS = ((230, 40, 40), (40, 210, 60), (50, 80, 240), (235, 215, 40))


def make_shapes32(root, train_per_class=24, val_per_class=4, size=32, seed=0):
    """ImageNet-layout set of flat-coloured shapes (class c: shape c in colour c) as PNGs.

    ``root/{train,val}/class<c>/<i>.png`` and ``root/meta/{train,val,classes}.txt``.
    """
    from PIL import Image, ImageDraw
    rng = np.random.default_rng(seed)
    os.makedirs(osp.join(root, 'meta'), exist_ok=True)
    for split, count in (('train', train_per_class), ('val', val_per_class)):
        lines = []
        for label, color in enumerate(SHAPE_COLORS):
            os.makedirs(osp.join(root, split, f'class{label}'), exist_ok=True)
            for i in range(count):
                img = Image.new('RGB', (size, size), (30, 30, 30))
                draw = ImageDraw.Draw(img)
                r = rng.uniform(0.25, 0.4) * size
                cx, cy = rng.uniform(r, size - r, 2)
                if label == 0:
                    draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=color)
                elif label == 1:
                    draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=color)
                elif label == 2:
                    draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=color)
                else:
                    w = r / 3
                    draw.rectangle([cx - w, cy - r, cx + w, cy + r], fill=color)
                    draw.rectangle([cx - r, cy - w, cx + r, cy + w], fill=color)
                name = f'class{label}/{i:03d}.png'
                img.save(osp.join(root, split, name))
                lines.append(f'{name} {label}')
        with open(osp.join(root, 'meta', f'{split}.txt'), 'w') as f:
            f.write('\n'.join(lines) + '\n')
    with open(osp.join(root, 'meta', 'classes.txt'), 'w') as f:
        f.write('\n'.join(f'class{c}' for c in range(len(SHAPE_COLORS))) + '\n')
    return root


@pytest.fixture(scope='module')
def shapes32(tmp_path_factory):
    return make_shapes32(str(tmp_path_factory.mktemp('shapes32')))


def test_class_image_folder(shapes32):
    ds = ClassImageFolder(shapes32, data_prefix='train', ann_file='meta/train.txt',
                          classes='meta/classes.txt', image_size=16, random_flip=True)
    assert len(ds) == 96 and len(ds.metainfo['classes']) == 4
    item = ds[30]
    assert item['inputs'].shape == (3, 16, 16) and item['inputs'].dtype == torch.uint8
    assert item['data_samples']['gt_label'] == 1
    scanned = ClassImageFolder(shapes32, data_prefix='train', image_size=32, indices=10, test_mode=True)
    assert len(scanned) == 10 and scanned.metainfo['classes'] == ['class0', 'class1', 'class2', 'class3']
    with pytest.raises(FileNotFoundError, match='image folder'):
        ClassImageFolder(shapes32, data_prefix='nope')
    with pytest.raises(FileNotFoundError, match='ann_file'):
        ClassImageFolder(shapes32, data_prefix='train', ann_file='meta/missing.txt')


def test_latent_configs():
    base = Config.fromfile(LATENT_CONFIGS['s'])
    assert base.custom_imports['imports'] == ['polaformerpp.generation']
    assert base.train_dataloader.batch_size == 32 and base.train_cfg.max_iters == 400_000
    assert base.optim_wrapper.optimizer == dict(type='AdamW', lr=1e-4, weight_decay=0.0)
    assert base.custom_hooks[0].type == 'EMAHook' and base.custom_hooks[0].momentum == 1e-4
    assert base.model.space == 'latent' and base.model.vae.scale_factor == 0.18215
    assert base.model.sample_cfg.num_steps == 250
    for size, path in LATENT_CONFIGS.items():
        cfg = Config.fromfile(path)
        name = f'DiT-{size.upper()}/2'
        assert cfg.model.dit.type == name and cfg.model.dit.attn_type == 'pola'
        with torch.device('meta'):
            net = MODELS.build(cfg.model.dit)
        assert net.input_size == (32, 32) and net.in_channels == 4 and net.num_classes == 1000
    with pytest.raises(FileNotFoundError, match='sd-vae-ft-ema'):
        MODELS.build(base.model)  # no VAE weights on this machine: a clear error


def test_metafile_lists_the_configs_with_their_parameter_counts():
    import yaml
    with open(osp.join(osp.dirname(__file__), '..', 'configs/generation/metafile.yml')) as f:
        models = {m['Name']: m for m in yaml.safe_load(f)['Models']}
    for size, path in LATENT_CONFIGS.items():
        entry = models[osp.splitext(osp.basename(path))[0]]
        assert entry['Config'] == path
        assert entry['Metadata']['Parameters'] == dit_param_count(f'DiT-{size.upper()}/2',
                                                                  attn_type='pola')
    assert models[osp.splitext(osp.basename(PIXEL_CONFIG))[0]]['Config'] == PIXEL_CONFIG


def test_pixel_config_builds():
    cfg = Config.fromfile(PIXEL_CONFIG)
    model = MODELS.build(cfg.model)
    assert model.space == 'pixel' and model.dit.in_channels == 3 and model.vae is None
    assert cfg.val_evaluator.type == 'GenerationFID'


# --------------------------------------------------------------------- bad input
def test_bad_inputs_get_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown DiT arch 'DiT-XXL/2'.*DiT-B/2"):
        DiT('DiT-XXL/2')
    with pytest.raises(KeyError):
        MODELS.build(dict(type='DiT-XXL/2'))
    with pytest.raises(ValueError, match='divisible by the patch size 8'):
        DiT('DiT-S/8', input_size=36)
    with pytest.raises(ValueError, match='attn_type'):
        tiny_dit(attn_type='flash')
    with pytest.raises(ValueError, match='arch dict needs exactly'):
        DiT(dict(depth=2, hidden_size=32))
    net = tiny_dit()
    with pytest.raises(ValueError, match=r'x must have shape \(B, 3, 8, 8\)'):
        net(torch.randn(1, 3, 16, 16), torch.tensor([1]), torch.tensor([0]))
    with pytest.raises(ValueError, match="space='latent' needs model.vae.*sd-vae-ft-ema"):
        DiTDiffusion(dit=dict(type='DiT-S/2', input_size=32), space='latent')
    with pytest.raises(FileNotFoundError, match='not found'):
        DiTDiffusion(dit=dict(type='DiT-S/2', input_size=32), space='latent',
                     vae=dict(type='SDVAE', path=str(tmp_path / 'no-vae')))
    with pytest.raises(ValueError, match='in_channels=3'):
        DiTDiffusion(dit=dict(type='DiT-S/2', input_size=32), space='pixel')
    model = tiny_model()
    with pytest.raises(ValueError, match=r'class labels must be in \[0, 3\]'):
        model.sample(torch.tensor([0, 4]))
    with pytest.raises(ValueError, match='num_steps must be in'):
        model.sample(torch.tensor([0]), num_steps=0)
    with pytest.raises(ValueError, match="sampler must be 'ddpm' or 'ddim'"):
        model.sample(torch.tensor([0]), sampler='euler')
    with pytest.raises(ValueError, match='no weights'):
        InceptionV3Features(None)
    with pytest.raises(FileNotFoundError, match='Inception-v3 weights'):
        InceptionV3Features(str(tmp_path / 'inception.pth'))
    not_inception = tmp_path / 'other.pth'
    torch.save({'w': torch.zeros(1)}, not_inception)
    with pytest.raises(ValueError, match='neither TorchScript nor an inception_v3'):
        InceptionV3Features(str(not_inception))
    with pytest.raises(ValueError, match='betas'):
        GaussianDiffusion(betas=[0.1, 1.5])

    sample = load_tool('tools/generation/sample.py')
    with pytest.raises(ValueError, match='--cfg-scale must be >= 1'):
        sample.parse_args([PIXEL_CONFIG, 'x.pth', '--out-dir', str(tmp_path), '--cfg-scale', '0.5'])
    with pytest.raises(FileNotFoundError, match='checkpoint not found'):
        sample.parse_args([PIXEL_CONFIG, str(tmp_path / 'x.pth'), '--out-dir', str(tmp_path)])
    fid = load_tool('tools/generation/fid.py')
    images = tmp_path / 'images.npz'
    np.savez(images, arr_0=np.zeros((4, 8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match='--inception PATH'):
        fid.compute(fid.parse_args([str(images), str(images)]))
    with pytest.raises(FileNotFoundError, match='missing.npz'):
        fid.compute(fid.parse_args([str(images), str(tmp_path / 'missing.npz')]))
    bad = tmp_path / 'bad.npz'
    np.savez(bad, something=np.zeros(3))
    with pytest.raises(ValueError, match="none of the keys"):
        load_reference(str(bad))


@pytest.mark.filterwarnings('ignore::FutureWarning')  # torch.jit is deprecated in torch 2.x
def test_inception_features_from_a_torchscript_file(tmp_path):
    class PoolAndLogits(torch.nn.Module):  # stands in for a scripted Inception-v3
        def forward(self, x):
            pool = x.mean(dim=(2, 3))
            return pool, pool[:, :2]

    path = str(tmp_path / 'inception.pt')
    torch.jit.script(PoolAndLogits()).save(path)
    extractor = InceptionV3Features(path, resize=20)
    assert extractor.scripted is not None
    out = extractor(torch.full((2, 3, 8, 8), 255, dtype=torch.uint8))
    assert out['pool'].shape == (2, 3) and out['logits'].shape == (2, 2)
    torch.testing.assert_close(out['pool'], torch.ones(2, 3))  # uint8 255 -> 1.0 in [-1, 1]


def test_fid_tool_on_feature_files(tmp_path):
    rng = np.random.default_rng(0)
    a, b = tmp_path / 'a.npz', tmp_path / 'b.npz'
    np.savez(a, pool=rng.normal(0, 1, (500, 4)), logits=rng.normal(size=(500, 10)))
    np.savez(b, mu=np.full(4, 1.0), sigma=np.eye(4))
    fid = load_tool('tools/generation/fid.py')
    out = tmp_path / 'fid.json'
    result = fid.main([str(a), str(b), '--out-json', str(out)])
    assert result['FID'] == pytest.approx(4.0, abs=0.5) and result['IS'] > 1.0
    assert json.loads(out.read_text())['FID'] == pytest.approx(result['FID'])


# ----------------------------------------------------------------- end to end
def _scalars(work_dir):
    logs = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    assert logs, f'no scalars.json under {work_dir}'
    with open(logs[-1]) as f:
        return [json.loads(line) for line in f if line.strip()]


TINY_OPTIONS = ['model.dit.arch.hidden_size=64', 'model.dit.arch.depth=2', 'model.dit.arch.num_heads=2']


@pytest.mark.slow
def test_pixel_dit_end_to_end(shapes32, tmp_path):
    """tools/train.py (loss falls, FID validation) -> sample.py (1 process and torchrun x2) -> fid.py."""
    work_dir = str(tmp_path / 'work')
    iters = 100
    data = [f'{split}.dataset.data_root={shapes32}'
            for split in ('train_dataloader', 'val_dataloader', 'test_dataloader')]
    run_tool(['tools/train.py', PIXEL_CONFIG, '--work-dir', work_dir, '--cfg-options', *data,
              *TINY_OPTIONS, 'train_dataloader.batch_size=16', f'train_cfg.max_iters={iters}',
              f'train_cfg.val_interval={iters}', 'val_dataloader.batch_size=16',
              'optim_wrapper.optimizer.lr=2e-3', 'param_scheduler.0.end=10',
              'model.sample_cfg.num_steps=5', 'custom_hooks.0.momentum=0.1',
              'default_hooks.logger.interval=5', f'default_hooks.checkpoint.interval={iters}'])
    records = _scalars(work_dir)
    losses = [r['loss_mse'] for r in records if 'loss_mse' in r]
    assert np.mean(losses[-3:]) < 0.5 * np.mean(losses[:3]), losses
    fids = [r['gen/FID'] for r in records if 'gen/FID' in r]
    assert fids and all(np.isfinite(fids)), records[-1]
    ckpt = osp.join(work_dir, f'iter_{iters}.pth')
    assert osp.isfile(ckpt)

    common = ['--labels', '0', '1', '2', '3', '--num-samples', '8', '--steps', '5', '--sampler', 'ddim',
              '--seed', '3', '--batch-size', '3', '--cfg-options', *TINY_OPTIONS]
    single, dist = tmp_path / 'single', tmp_path / 'dist'
    run_tool(['tools/generation/sample.py', PIXEL_CONFIG, ckpt, '--out-dir', str(single), *common])
    run_tool(['-m', 'torch.distributed.run', '--nproc_per_node', '2', '--master_port', str(free_port()),
              'tools/generation/sample.py', PIXEL_CONFIG, ckpt, '--out-dir', str(dist),
              '--launcher', 'pytorch', *common], env=dict(OMP_NUM_THREADS='1'))
    a = np.load(single / 'samples_8x32x32x3.npz')
    b = np.load(dist / 'samples_8x32x32x3.npz')
    assert a['arr_0'].shape == (8, 32, 32, 3) and a['arr_0'].dtype == np.uint8
    assert a['arr_1'].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    # a fixed seed gives the same images, whatever the process count and batching
    assert np.abs(a['arr_0'].astype(int) - b['arr_0']).max() <= 1
    assert osp.isfile(single / 'grid_000.png') and osp.isfile(dist / 'grid_000.png')

    # class-conditional: the same noise under another label gives another image
    sample = load_tool('tools/generation/sample.py')
    options = {key: int(value) for key, value in (o.split('=') for o in TINY_OPTIONS)}
    model = sample.build_model(PIXEL_CONFIG, ckpt, options)
    by_class = [model.sample(torch.full((4, ), c), num_steps=5, sampler='ddim', cfg_scale=3.0,
                             generator=sample_generators(3, range(4))).float() for c in range(2)]
    assert (by_class[0] - by_class[1]).abs().mean() > 1.0

    real = tmp_path / 'real.npz'
    val = ClassImageFolder(shapes32, 'val', 'meta/val.txt', image_size=32, test_mode=True)
    np.savez(real, arr_0=np.stack([val[i]['inputs'].permute(1, 2, 0).numpy() for i in range(len(val))]))
    out_json = tmp_path / 'fid.json'
    run_tool(['tools/generation/fid.py', str(single / 'samples_8x32x32x3.npz'), str(real),
              '--extractor', 'random-conv', '--out-json', str(out_json)])
    result = json.loads(out_json.read_text())
    assert np.isfinite(result['FID']) and result['FID'] > 0 and np.isfinite(result['IS'])


@pytest.mark.slow
def test_dist_train_two_cpu_processes(shapes32, tmp_path):
    """tools/dist_train.sh: DDP over gloo with 2 CPU processes, FID validation gathered across ranks."""
    work_dir = str(tmp_path / 'dist')
    data = [f'{split}.dataset.data_root={shapes32}'
            for split in ('train_dataloader', 'val_dataloader', 'test_dataloader')]
    proc = run_tool(['tools/dist_train.sh', PIXEL_CONFIG, '2', '--work-dir', work_dir, '--cfg-options',
                     *data, *TINY_OPTIONS, 'train_dataloader.batch_size=8', 'train_cfg.max_iters=4',
                     'train_cfg.val_interval=4', 'val_dataloader.batch_size=4',
                     'val_dataloader.dataset.indices=8', 'model.sample_cfg.num_steps=2',
                     'default_hooks.logger.interval=2', 'default_hooks.checkpoint.interval=4'],
                    env=dict(PORT=str(free_port()), OMP_NUM_THREADS='1'))
    log = proc.stdout + proc.stderr
    assert 'Distributed training: True' in log and 'GPU number: 2' in log, log[-3000:]
    assert osp.isfile(osp.join(work_dir, 'iter_4.pth'))
    assert any(np.isfinite(r.get('gen/FID', np.nan)) for r in _scalars(work_dir))
