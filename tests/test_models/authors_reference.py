"""An independent re-implementation of the authors' PolaFormer++ classifier (a test fixture).

Written from the method description and the authors' release with their module
names and conventions (NCHW tensors, ``s1``/``s2`` through a sigmoid,
``exp(x*t) - 1`` feature maps, RoPE on the feature maps, ``N^-1/2`` on each side
of ``K^T V``, ``RoPE.angle``/``RoPE_linear.angle`` buffers). It shares no code
with the project: a synthetic authors'-format checkpoint of it is converted and
must give the same logits in the project's classifier.

Not a test module: the converter tests load it by path (``load_tool``).
"""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

# the published classifiers (1000 classes): embed dims, depths, heads, P, parameter count
ARCHS = {
    'b0': ([32, 64, 128, 384], [2, 2, 2, 2], [1, 2, 4, 12], 2048, 7_548_712),
    'b1': ([32, 64, 192, 384], [2, 2, 4, 2], [1, 2, 6, 12], 2048, 9_227_496),
    'b2': ([64, 128, 256, 512], [2, 2, 6, 2], [1, 2, 4, 8], 2048, 16_450_664),
    'b3': ([64, 128, 320, 512], [3, 5, 9, 3], [1, 2, 5, 8], 2048, 27_145_896),
    'b4': ([96, 192, 384, 512], [4, 6, 12, 6], [1, 2, 6, 8], 2048, 49_798_792),
    'b5': ([96, 192, 448, 640], [4, 7, 19, 8], [1, 2, 7, 10], 2560, 97_773_000),
}
RELEASED_ATTN = ('linear', 'linear', 'softmax', 'softmax')


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


def broken_state_dict(state_dict):
    """A copy with one key the converter does not know and one key removed:
    ``layers.1.blocks.0.attn.extra_scale`` added, ``layers.1.blocks.1.attn.lepe.bias`` deleted."""
    bad = dict(state_dict)
    bad['layers.1.blocks.0.attn.extra_scale'] = torch.ones(3)
    del bad['layers.1.blocks.1.attn.lepe.bias']
    return bad
