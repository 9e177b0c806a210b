"""Tests of tools/model_converters/polapp_official2mm.py.

The reference below is an independent re-implementation of the authors'
PolaFormer++ classifier, written from SPEC sections 1-2 with their module names
and conventions (NCHW tensors, ``s1``/``s2`` through a sigmoid, ``exp(x*t) - 1``
feature maps, RoPE on the feature maps, ``N^-1/2`` on each side of ``K^T V``,
``RoPE.angle``/``RoPE_linear.angle`` buffers). It shares no code with the
project: a synthetic authors'-format checkpoint of it is converted and must give
the same logits in the project's classifier.
"""
import copy
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / 'shared'
CONVERTER = REPO / 'tools' / 'model_converters' / 'polapp_official2mm.py'
B0_CONFIG = REPO / 'configs' / 'classification' / 'polapp-b0_8xb256_in1k.py'
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

ARCHS = {  # SPEC section 2: embed dims, depths, heads, P, params of the 1000-class classifier
    'b0': ([32, 64, 128, 384], [2, 2, 2, 2], [1, 2, 4, 12], 2048, 7_548_712),
    'b1': ([32, 64, 192, 384], [2, 2, 4, 2], [1, 2, 6, 12], 2048, 9_227_496),
    'b2': ([64, 128, 256, 512], [2, 2, 6, 2], [1, 2, 4, 8], 2048, 16_450_664),
    'b3': ([64, 128, 320, 512], [3, 5, 9, 3], [1, 2, 5, 8], 2048, 27_145_896),
    'b4': ([96, 192, 384, 512], [4, 6, 12, 6], [1, 2, 6, 8], 2048, 49_798_792),
    'b5': ([96, 192, 448, 640], [4, 7, 19, 8], [1, 2, 7, 10], 2560, 97_773_000),
}
RELEASED_ATTN = ('linear', 'linear', 'softmax', 'softmax')


def _load_converter():
    spec = importlib.util.spec_from_file_location('polapp_official2mm', CONVERTER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


conv = _load_converter()


# ============================================================================ the authors' model
def theta_shift(x, sin, cos):
    x1, x2 = x[..., ::2], x[..., 1::2]
    return x * cos + torch.stack([-x2, x1], dim=-1).flatten(-2) * sin


class RoPE(nn.Module):
    """2-D RoPE over ``embed_dim`` channels: rows on the first half, columns on the second."""

    def __init__(self, embed_dim):
        super().__init__()
        angle = 1.0 / (10000 ** torch.linspace(0, 1, embed_dim // 4))
        self.register_buffer('angle', angle.unsqueeze(-1).repeat(1, 2).flatten())

    def forward(self, H, W):
        a_h = torch.arange(H).to(self.angle)[:, None, None] * self.angle  # H, 1, c/2
        a_w = torch.arange(W).to(self.angle)[None, :, None] * self.angle  # 1, W, c/2
        ang = torch.cat([a_h.expand(H, W, -1), a_w.expand(H, W, -1)], dim=-1).reshape(H * W, -1)
        return torch.sin(ang), torch.cos(ang)


class LayerNorm2d(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x):
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class PolaLinearAttention(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.s1 = nn.Parameter(torch.zeros(1, num_heads, 1, 2 * head_dim))
        self.s2 = nn.Parameter(torch.zeros(1, num_heads, 1, 2 * head_dim))
        self.qkvg = nn.Linear(dim, 4 * dim)
        self.lepe = nn.Conv2d(dim, dim, 5, 1, 2, groups=dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, sin, cos):
        B, C, H, W = x.shape
        N = H * W
        q, k, v, g = self.qkvg(x.flatten(2).transpose(1, 2)).chunk(4, dim=-1)
        lepe = self.lepe(v.transpose(1, 2).reshape(B, C, H, W)).flatten(2).transpose(1, 2)
        q, k, v = (t.reshape(B, N, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))
        q_sim = torch.exp(torch.cat([F.relu(q), F.relu(-q)], dim=-1) * torch.sigmoid(self.s1)) - 1
        q_opp = torch.exp(torch.cat([F.relu(-q), F.relu(q)], dim=-1) * torch.sigmoid(self.s2)) - 1
        k = torch.exp(torch.cat([F.relu(k), F.relu(-k)], dim=-1)) - 1
        v1, v2 = v.chunk(2, dim=-1)
        k_mean = k.mean(dim=-2, keepdim=True).transpose(-2, -1)
        z_sim = 1 / (q_sim @ k_mean + 1e-6)
        z_opp = 1 / (q_opp @ k_mean + 1e-6)
        q_sim, q_opp, k = (theta_shift(t, sin, cos) for t in (q_sim, q_opp, k))
        kv1 = (k.transpose(-2, -1) * N ** -0.5) @ (v1 * N ** -0.5)
        kv2 = (k.transpose(-2, -1) * N ** -0.5) @ (v2 * N ** -0.5)
        x = torch.cat([q_sim @ kv1 * z_sim, q_opp @ kv2 * z_opp], dim=-1)
        x = self.proj((x.transpose(1, 2).reshape(B, N, C) + lepe) * g)
        return x.transpose(1, 2).reshape(B, C, H, W)


class SoftmaxAttention(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.qkvo = nn.Linear(dim, 4 * dim)
        self.lepe = nn.Conv2d(dim, dim, 5, 1, 2, groups=dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, sin, cos):
        B, C, H, W = x.shape
        N = H * W
        q, k, v, o = self.qkvo(x.flatten(2).transpose(1, 2)).chunk(4, dim=-1)
        lepe = self.lepe(v.transpose(1, 2).reshape(B, C, H, W)).flatten(2).transpose(1, 2)
        q, k, v = (t.reshape(B, N, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))
        q, k = theta_shift(q, sin, cos), theta_shift(k, sin, cos)
        attn = ((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)).softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        x = self.proj((x + lepe) * o)
        return x.transpose(1, 2).reshape(B, C, H, W)


class FFN(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.dwconv = nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        x = self.act(self.fc1(x.permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        x = x + self.dwconv(x)
        return self.fc2(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class Block(nn.Module):
    def __init__(self, dim, num_heads, attn_type, layerscale=1.0):
        super().__init__()
        self.pos = nn.Conv2d(dim, dim, 3, 1, 1, groups=dim)
        self.norm1 = LayerNorm2d(dim)
        attn = PolaLinearAttention if attn_type == 'linear' else SoftmaxAttention
        self.attn = attn(dim, num_heads)
        self.norm2 = LayerNorm2d(dim)
        self.ffn = FFN(dim, int(3.5 * dim))
        self.gamma_1 = nn.Parameter(layerscale * torch.ones(1, dim, 1, 1))
        self.gamma_2 = nn.Parameter(layerscale * torch.ones(1, dim, 1, 1))

    def forward(self, x, sin, cos):  # eval only: no drop path
        x = x + self.pos(x)
        x = x + self.gamma_1 * self.attn(self.norm1(x), sin, cos)
        return x + self.gamma_2 * self.ffn(self.norm2(x))


class PatchMerging(nn.Module):
    def __init__(self, dim, out_dim):
        super().__init__()
        self.reduction = nn.Conv2d(dim, out_dim, 3, 2, 1)
        self.norm = nn.BatchNorm2d(out_dim)

    def forward(self, x):
        return self.norm(self.reduction(x))


class BasicLayer(nn.Module):
    def __init__(self, dim, out_dim, depth, num_heads, attn_type):
        super().__init__()
        head_dim = dim // num_heads
        self.attn_type = attn_type
        self.RoPE = RoPE(head_dim)
        self.RoPE_linear = RoPE(2 * head_dim)
        self.blocks = nn.ModuleList([Block(dim, num_heads, attn_type) for _ in range(depth)])
        self.downsample = PatchMerging(dim, out_dim) if out_dim else None

    def forward(self, x):
        sin, cos = (self.RoPE_linear if self.attn_type == 'linear' else self.RoPE)(*x.shape[-2:])
        for blk in self.blocks:
            x = blk(x, sin, cos)
        return self.downsample(x) if self.downsample is not None else x


class PatchEmbed(nn.Module):
    def __init__(self, in_chans, dim):
        super().__init__()
        self.proj = nn.Sequential(
            nn.Conv2d(in_chans, dim // 2, 3, 2, 1), nn.BatchNorm2d(dim // 2), nn.GELU(),
            nn.Conv2d(dim // 2, dim // 2, 3, 1, 1), nn.BatchNorm2d(dim // 2), nn.GELU(),
            nn.Conv2d(dim // 2, dim // 2, 3, 1, 1), nn.BatchNorm2d(dim // 2), nn.GELU(),
            nn.Conv2d(dim // 2, dim, 3, 2, 1), nn.BatchNorm2d(dim))

    def forward(self, x):
        return self.proj(x)


class AuthorsPolaFormerPP(nn.Module):
    def __init__(self, embed_dims, depths, num_heads, projection=2048, num_classes=1000,
                 attn_types=RELEASED_ATTN):
        super().__init__()
        self.patch_embed = PatchEmbed(3, embed_dims[0])
        self.layers = nn.ModuleList([
            BasicLayer(embed_dims[i], embed_dims[i + 1] if i < 3 else None, depths[i],
                       num_heads[i], attn_types[i]) for i in range(4)])
        self.proj = nn.Conv2d(embed_dims[-1], projection, 1)
        self.norm = nn.BatchNorm2d(projection)
        self.swish = nn.SiLU()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Conv2d(projection, num_classes, 1)

    def forward(self, x):
        x = self.patch_embed(x)
        for layer in self.layers:
            x = layer(x)
        x = self.avgpool(self.swish(self.norm(self.proj(x))))
        return self.head(x).flatten(1)


def authors_model(arch='b0', seed=0, **kwargs):
    """The reference for a zoo arch with every parameter and BN statistic randomised."""
    dims, depths, heads, proj, _ = ARCHS[arch]
    torch.manual_seed(seed)
    model = AuthorsPolaFormerPP(dims, depths, heads, proj, **kwargs)
    return randomize_(model).eval()


def randomize_(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit('.', 1)[-1]
            if leaf in ('s1', 's2'):  # temperature logits
                p.normal_(0, 1.5)
            elif leaf.startswith('gamma_'):  # layer scales, both signs
                p.normal_(0.3, 0.6)
            elif p.dim() == 1 and leaf == 'weight':  # LN / BN affine
                p.uniform_(0.5, 1.5)
            elif leaf == 'bias':
                p.normal_(0, 0.1)
        for name, b in model.named_buffers():
            if name.endswith('running_mean'):
                b.normal_(0, 0.2)
            elif name.endswith('running_var'):
                b.uniform_(0.5, 2.0)
            elif name.endswith('num_batches_tracked'):
                b.fill_(1234)
    return model


# ============================================================================ helpers
def project_classifier(arch, num_classes, attn_types=RELEASED_ATTN):
    """PolaFormerPP + global average pooling + Linear, keyed like the mmpretrain classifier."""
    from polaformerpp.models import PolaFormerPP

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = PolaFormerPP(arch=arch, out_indices=(4, ), attn_types=attn_types)
            self.head = nn.Module()
            self.head.fc = nn.Linear(self.backbone.num_features[-1], num_classes)

        def forward(self, x):
            return self.head.fc(self.backbone(x)[-1].mean(dim=(2, 3)))

    return Classifier().eval()


def max_rel_err(out, ref):
    return ((out - ref).abs().max() / ref.abs().max()).item()


def assert_same_logits(model, reference, sizes=((2, 64, 64), (1, 48, 80)), dtype=torch.float32):
    """Max relative error (max |diff| / max |ref|) < 1e-5 on square and non-square inputs.

    fp32 (measured ~5e-7; ~1e-9 in float64, where CPU depthwise convs are slow).
    """
    model, reference = copy.deepcopy(model).to(dtype).eval(), copy.deepcopy(reference).to(dtype).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for b, h, w in sizes:
            x = torch.randn(b, 3, h, w, generator=gen, dtype=torch.float64).to(dtype)
            ref = reference(x)
            out = model(x)
            assert out.shape == ref.shape
            assert torch.isfinite(ref).all() and ref.abs().max() > 1e-3
            assert max_rel_err(out, ref) < 1e-5, f'input {(b, 3, h, w)}: {max_rel_err(out, ref):.3g}'


def run_cli(*args):
    env = dict(os.environ, OMP_NUM_THREADS='1')
    return subprocess.Popen([sys.executable, str(CONVERTER), *map(str, args)], cwd=str(REPO), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope='module', autouse=True)
def _one_thread():
    """These models are tiny: one thread avoids oversubscription on busy CI machines."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope='module')
def b0():
    """Reference models, their authors'-format checkpoint and two CLI runs started in parallel."""
    tmp = Path(__import__('tempfile').mkdtemp(prefix='polapp_conv_'))
    model, ema = authors_model('b0', seed=0), authors_model('b0', seed=1)
    src = tmp / 'official_b0.pth'
    torch.save({'model': model.state_dict(), 'state_dict_ema': ema.state_dict(), 'epoch': 299}, src)
    bad_sd = dict(model.state_dict())
    bad_sd['layers.1.blocks.0.attn.extra_scale'] = torch.ones(3)
    del bad_sd['layers.1.blocks.1.attn.lepe.bias']
    bad = tmp / 'bad.pth'
    torch.save({'model': bad_sd}, bad)
    jobs = {
        'plain': (run_cli(src, tmp / 'mm_b0.pth'), tmp / 'mm_b0.pth'),
        'bad': (run_cli(bad, tmp / 'mm_bad.pth'), tmp / 'mm_bad.pth'),
    }
    runs = {}
    for name, (proc, dst) in jobs.items():
        out, _ = proc.communicate(timeout=120)
        runs[name] = (proc.returncode, out, dst)
    yield dict(model=model, ema=ema, src=src, bad_sd=bad_sd, runs=runs, tmp=tmp)
    import shutil
    shutil.rmtree(tmp, ignore_errors=True)


# ============================================================================ the reference itself
def test_reference_matches_authors_key_list():
    keys_file = SHARED / 'authors_checkpoint_keys_b0.txt'
    if not keys_file.is_file():
        pytest.skip(f'{keys_file} not available')
    expected = []
    for line in keys_file.read_text().splitlines():
        if line.strip() and not line.startswith('#'):
            m = re.fullmatch(r'(\S+) \(([\d, ]*)\) (\w+)', line.strip())
            assert m, line
            shape = tuple(int(s) for s in m.group(2).replace(' ', '').split(',') if s)
            expected.append((m.group(1), shape, m.group(3)))
    with torch.device('meta'):
        sd = AuthorsPolaFormerPP(*ARCHS['b0'][:4]).state_dict()
    got = [(k, tuple(v.shape), str(v.dtype).replace('torch.', '')) for k, v in sd.items()]
    assert got == expected


@pytest.mark.parametrize('arch', sorted(ARCHS))
def test_reference_param_counts_and_arch_inference(arch):
    dims, depths, heads, proj, params = ARCHS[arch]
    with torch.device('meta'):
        model = AuthorsPolaFormerPP(dims, depths, heads, proj)
    assert sum(p.numel() for p in model.parameters()) == params  # SPEC section 2
    inferred = conv.infer_arch(model.state_dict())
    assert inferred['name'] == arch
    assert (inferred['embed_dims'], inferred['depths'], inferred['num_heads']) == (dims, depths, heads)
    assert inferred['cls_proj_channels'] == proj and inferred['num_classes'] == 1000
    assert inferred['attn_types'] == list(RELEASED_ATTN)


# ============================================================================ conversion
def test_convert_function_b0_reproduces_logits(b0):
    model = b0['model']
    new_sd, report = conv.convert_official_state_dict(model.state_dict())
    assert report.ok, report.problems()
    assert report.arch['name'] == 'b0'
    assert len(report.dropped) == 8 and all('angle' in k for k, _ in report.dropped)
    assert not report.warnings
    assert len(report.mapped) + len(report.dropped) == len(model.state_dict())
    assert new_sd['backbone.stages.0.blocks.1.attn.temp_same'].shape == (1, 64)
    torch.testing.assert_close(new_sd['backbone.stages.1.blocks.0.attn.temp_opp'],
                               model.layers[1].blocks[0].attn.s2.detach().reshape(2, 64))
    torch.testing.assert_close(new_sd['backbone.stages.3.blocks.1.gamma2'],
                               model.layers[3].blocks[1].gamma_2.detach().flatten())
    torch.testing.assert_close(new_sd['head.fc.weight'], model.head.weight.detach().flatten(1))

    ours = project_classifier('b0', 1000)
    ours.load_state_dict(new_sd, strict=True)
    assert_same_logits(ours, model)


def test_cli_into_config_classifier(b0):
    rc, out, dst = b0['runs']['plain']
    assert rc == 0, out
    assert 'arch b0' in out
    ckpt = torch.load(dst, map_location='cpu', weights_only=True)
    assert set(ckpt) == {'state_dict', 'meta'}
    meta = ckpt['meta']
    assert meta['arch'] == 'b0' and meta['num_classes'] == 1000 and meta['source_weights'] == 'model'
    assert meta['attn_types'] == list(RELEASED_ATTN) and meta['complete'] is True

    pytest.importorskip('mmpretrain')
    from mmengine.config import Config

    import polaformerpp  # noqa: F401  (registers PolaFormerPP)
    from mmpretrain.registry import MODELS
    assert B0_CONFIG.is_file(), f'{B0_CONFIG} is missing'
    cfg = Config.fromfile(str(B0_CONFIG))
    model_cfg = copy.deepcopy(cfg.model)
    model_cfg.pop('train_cfg', None)  # Mixup/CutMix: training only
    classifier = MODELS.build(model_cfg).eval()  # init_cfg is not applied (no init_weights)
    classifier.load_state_dict(ckpt['state_dict'], strict=True)

    class Logits(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(x, mode='tensor')

    assert_same_logits(Logits(classifier), b0['model'])


def test_ema_picks_ema_weights(b0, capsys):
    dst = b0['tmp'] / 'mm_b0_ema.pth'
    assert conv.main([str(b0['src']), str(dst), '--ema']) == 0  # the CLI entry point, in-process
    assert 'state_dict_ema' in capsys.readouterr().out
    ckpt = torch.load(dst, map_location='cpu', weights_only=True)
    assert ckpt['meta']['source_weights'] == 'state_dict_ema'
    sd = ckpt['state_dict']
    ema, plain = b0['ema'], b0['model']
    torch.testing.assert_close(sd['backbone.stem.0.conv.weight'], ema.patch_embed.proj[0].weight.detach())
    assert not torch.equal(sd['backbone.stem.0.conv.weight'], plain.patch_embed.proj[0].weight.detach())
    ours = project_classifier('b0', 1000)
    ours.load_state_dict(sd, strict=True)
    assert_same_logits(ours, ema, sizes=((1, 64, 64), ))


def test_unknown_and_missing_keys_are_reported(b0):
    extra = 'layers.1.blocks.0.attn.extra_scale'
    missing = 'backbone.stages.1.blocks.1.attn.lepe.bias'
    _, report = conv.convert_official_state_dict(b0['bad_sd'])
    assert not report.ok
    assert report.unknown == [extra]
    assert report.missing == [f'{missing} (from layers.1.blocks.1.attn.lepe.bias)']

    rc, out, dst = b0['runs']['bad']
    assert rc != 0
    assert extra in out and missing in out
    assert not dst.exists()

    partial = b0['tmp'] / 'partial.pth'
    with pytest.raises(conv.CheckpointFormatError, match=re.escape(extra)):
        conv.convert_file(str(b0['tmp'] / 'bad.pth'), str(partial), log=lambda *a: None)
    assert not partial.exists()
    report = conv.convert_file(str(b0['tmp'] / 'bad.pth'), str(partial), allow_partial=True,
                               log=lambda *a: None)
    assert not report.ok
    assert torch.load(partial, weights_only=True)['meta']['complete'] is False


def test_shape_mismatch_is_reported(b0):
    sd = dict(b0['model'].state_dict())
    sd['layers.0.blocks.0.ffn.fc2.bias'] = torch.zeros(31)
    _, report = conv.convert_official_state_dict(sd)
    assert not report.ok
    assert len(report.shape_mismatch) == 1
    assert 'backbone.stages.0.blocks.0.ffn.fc2.bias' in report.shape_mismatch[0]


def test_rope_buffers_checked_and_dropped(b0):
    sd = dict(b0['model'].state_dict())
    sd['layers.2.RoPE.angle'] = sd['layers.2.RoPE.angle'] * 1.01
    with pytest.warns(UserWarning, match='layers.2.RoPE.angle'):
        new_sd, report = conv.convert_official_state_dict(sd)
    assert report.ok and len(report.warnings) == 1
    assert not any('angle' in k or 'RoPE' in k for k in new_sd)


def test_checkpoint_containers(b0, tmp_path):
    sd = b0['model'].state_dict()
    for obj, entry in ((sd, '<bare>'), ({'state_dict': sd}, 'state_dict'),
                       ({'model': {f'module.{k}': v for k, v in sd.items()}}, 'model')):
        path = tmp_path / 'ckpt.pth'
        torch.save(obj, path)
        loaded, name = conv.load_official_checkpoint(str(path))
        assert name == entry
        new_sd, report = conv.convert_official_state_dict(loaded)
        assert report.ok, report.problems()


def test_not_a_checkpoint(b0, tmp_path, capsys):
    text = tmp_path / 'notes.txt'
    text.write_text('not a checkpoint')
    with pytest.raises(conv.CheckpointFormatError, match='not a loadable torch checkpoint'):
        conv.load_official_checkpoint(str(text))
    assert conv.main([str(text), str(tmp_path / 'out.pth')]) == 1
    assert 'not a loadable torch checkpoint' in capsys.readouterr().err

    no_weights = tmp_path / 'opt.pth'
    torch.save({'optimizer': {'lr': 0.1}, 'epoch': 3}, no_weights)
    with pytest.raises(conv.CheckpointFormatError, match='no weights found'):
        conv.load_official_checkpoint(str(no_weights))
    with pytest.raises(conv.CheckpointFormatError, match='no EMA weights'):
        conv.load_official_checkpoint(str(b0['tmp'] / 'bad.pth'), ema=True)
    with pytest.raises(FileNotFoundError):
        conv.load_official_checkpoint(str(tmp_path / 'nope.pth'))
    with pytest.raises(conv.CheckpointFormatError, match='4 stages'):
        conv.convert_official_state_dict({'conv.weight': torch.zeros(3, 3)})


def test_custom_arch_all_linear():
    dims, depths, heads = [16, 32, 48, 64], [1, 1, 2, 1], [1, 2, 3, 4]
    attn = ('linear', ) * 4
    torch.manual_seed(3)
    model = randomize_(AuthorsPolaFormerPP(dims, depths, heads, projection=96, num_classes=10,
                                           attn_types=attn)).eval()
    new_sd, report = conv.convert_official_state_dict(model.state_dict())
    assert report.ok, report.problems()
    arch = report.arch
    assert arch['name'] == 'custom' and arch['attn_types'] == list(attn)
    assert (arch['embed_dims'], arch['depths'], arch['num_heads']) == (dims, depths, heads)
    assert (arch['cls_proj_channels'], arch['num_classes']) == (96, 10)
    ours = project_classifier(dict(embed_dims=dims, depths=depths, num_heads=heads, cls_proj_channels=96),
                              10, attn_types=attn)
    ours.load_state_dict(new_sd, strict=True)
    assert_same_logits(ours, model, sizes=((2, 40, 56), ))
