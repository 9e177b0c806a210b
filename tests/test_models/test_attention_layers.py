"""The token mixers and the block (plain and fused): one projection name, the head split, stochastic depth."""
import pytest
import torch

from polaformerpp.models.layers import ConvBN, ConvFFN, PolaFormerBlock, PolaLinearAttention, RoPESoftmaxAttention
from polaformerpp.ops import RopeGrid, apply_rope, pola_attention, rope_2d_tables
from polaformerpp.ops.fusion import (
    PolaLinearAttentionCPU,
    conv_bn_act,
    fuse_modules,
    inference_fusable,
    layer_norm_to_nchw,
    linear_act,
)


@pytest.mark.parametrize('cls', [PolaLinearAttention, RoPESoftmaxAttention])
def test_one_projection_name_for_both_kinds(cls):
    attn = cls(32, 2)
    assert sorted(k for k in attn.state_dict() if 'proj' in k) == [
        'in_proj.bias', 'in_proj.weight', 'proj.bias', 'proj.weight']
    assert tuple(attn.in_proj.weight.shape) == (128, 32)


@pytest.mark.parametrize('cls', [PolaLinearAttention, RoPESoftmaxAttention])
def test_split_heads_shapes_and_layout(cls):
    torch.manual_seed(0)
    attn = cls(32, 4)
    x = torch.randn(2, 3, 5, 32)
    q, k, v, gate, v_image = attn.split_heads(x)
    assert q.shape == k.shape == v.shape == (2, 4, 15, 8)
    assert gate.shape == (2, 3, 5, 32) and v_image.shape == (2, 32, 3, 5)
    proj = attn.in_proj(x)  # [q | k | v | gate], channel c of q in head c // d
    torch.testing.assert_close(q[:, 1, 7], proj[:, 7 // 5, 7 % 5, 8:16])
    torch.testing.assert_close(k[:, 3, 0], proj[:, 0, 0, 32 + 24:32 + 32])
    torch.testing.assert_close(v_image[:, :, 2, 4], proj[:, 2, 4, 64:96])
    torch.testing.assert_close(gate, proj[..., 96:])
    out = attn(x)
    assert out.shape == x.shape


def test_block_drop_path_semantics():
    """Per-sample: a sample's residual branch is dropped or kept scaled by 1 / keep; eval: identity."""
    block = PolaFormerBlock(16, 2, drop_path=0.5)
    x = torch.ones(64, 3, 4, 4)
    block.drop_path.train()
    torch.manual_seed(0)
    out = block.drop_path(x)
    per_sample = out.flatten(1)
    assert ((per_sample == 0).all(1) | (per_sample == 2).all(1)).all()
    assert 0 < (per_sample[:, 0] == 0).sum() < 64
    block.drop_path.eval()
    assert block.drop_path(x) is x
    assert not list(block.drop_path.parameters())


@pytest.mark.parametrize('rate', [-0.1, 1.0])
def test_block_rejects_bad_drop_path(rate):
    with pytest.raises(ValueError, match='drop_path'):
        PolaFormerBlock(16, 2, drop_path=rate)


def _randomised(module, seed=0):
    """``module`` with every parameter and BatchNorm statistic drawn at random (layer scales of both signs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        for name, b in module.named_buffers():
            if name.endswith('running_mean'):
                b.copy_(torch.randn(b.shape, generator=g) * 0.2)
            elif name.endswith('running_var'):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)
    return module


def _plain_block(block, x):
    """The block written out in NCHW as the method states it (stochastic depth off)."""
    F = torch.nn.functional
    attn, ffn = block.attn, block.ffn
    x = x + block.cpe(x)  # (B, C, H, W)
    t = x.permute(0, 2, 3, 1)
    y = block.norm1(t)
    B, H, W, C = y.shape
    q, k, v, gate = attn.in_proj(y).chunk(4, dim=-1)
    heads = [u.reshape(B, H * W, attn.num_heads, -1).transpose(1, 2) for u in (q, k, v)]
    if isinstance(attn, PolaLinearAttention):
        out = pola_attention(*heads, attn.temp_same.sigmoid(), attn.temp_opp.sigmoid(), rope=RopeGrid(H, W),
                             backend='torch')
    else:
        sin, cos = rope_2d_tables(H, W, attn.head_dim)
        out = F.scaled_dot_product_attention(apply_rope(heads[0], sin, cos), apply_rope(heads[1], sin, cos),
                                             heads[2])
    out = out.transpose(1, 2).reshape(B, H, W, C) + attn.lepe(v.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
    t = t + block.gamma1 * attn.proj(out * gate)
    h = F.gelu(ffn.fc1(block.norm2(t)))
    h = h + ffn.dwconv(h.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
    return (t + block.gamma2 * ffn.fc2(h)).permute(0, 3, 1, 2)


@pytest.mark.parametrize('fused', [False, True], ids=['plain', 'fused'])
@pytest.mark.parametrize('attn_type', ['linear', 'softmax'])
def test_block_equals_its_plain_form_in_inference_and_training(attn_type, fused):
    """The plain block and its fused form (channels-last tokens, fused epilogues and in-place passes in
    inference, the fused autograd path in training: values and every gradient) against the block written
    out in NCHW."""
    torch.manual_seed(0)
    block = _randomised(PolaFormerBlock(32, 2, attn_type=attn_type))
    if fused:
        fuse_modules(block)
    x = torch.randn(2, 32, 6, 5)
    tokens = x.permute(0, 2, 3, 1).contiguous()
    block.eval()
    with torch.no_grad():
        expected = _plain_block(block, x)
        torch.testing.assert_close(block(tokens.clone()).permute(0, 3, 1, 2), expected, rtol=1e-5, atol=1e-5)
    block.train()  # drop_path 0: the fused addcmul residuals also while training
    x_plain, x_ours = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ref = _plain_block(block, x_plain)
    ref_grads = torch.autograd.grad((ref * expected).sum(), [x_plain, *block.parameters()])
    out = block(x_ours.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad((out * expected).sum(), [x_ours, *block.parameters()])
    for (name, _), a, b in zip([('x', None), *block.named_parameters()], grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.parametrize('fused', [False, True], ids=['plain', 'fused'])
@pytest.mark.parametrize('attn_type', ['linear', 'softmax'])
def test_block_modules_keep_their_hooks(attn_type, fused):
    """Hooks on every module of the block (those the fused forms fold too: the token mixer, its
    products and LePE, the FFN's products and convs) fire in inference and training, and the output
    stays the same."""
    block = _randomised(PolaFormerBlock(32, 2, attn_type=attn_type))
    if fused:
        fuse_modules(block)
    tokens = torch.randn(2, 6, 5, 32)
    with torch.no_grad():
        expected = block.eval()(tokens)
    watched = [block.attn, block.attn.in_proj, block.attn.lepe, block.attn.proj, block.ffn.fc1, block.ffn.act,
               block.ffn.dwconv, block.ffn.fc2, block.cpe]
    calls = []
    handles = [m.register_forward_pre_hook(lambda module, args: calls.append(module)) for m in watched]
    try:
        with torch.no_grad():
            torch.testing.assert_close(block(tokens), expected, rtol=1e-5, atol=1e-5)
        assert calls == [block.cpe, block.attn, block.attn.in_proj, block.attn.lepe, block.attn.proj,
                         block.ffn.fc1, block.ffn.act, block.ffn.dwconv, block.ffn.fc2]
        calls.clear()
        block.train()(tokens).sum().backward()
        assert len(calls) == len(watched)
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.parametrize('act', [None, torch.nn.GELU(), torch.nn.SiLU()], ids=['none', 'gelu', 'silu'])
@pytest.mark.parametrize('stride', [1, 2])
def test_fused_conv_bn_act_equals_the_modules(act, stride):
    """BatchNorm folded into the conv with the activation as oneDNN's post-op: the modules' output,
    channels-last memory kept."""
    torch.manual_seed(0)
    layer = _randomised(ConvBN(8, 12, stride=stride)).eval()
    x = torch.randn(2, 8, 9, 7).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        expected = layer.bn(layer.conv(x))
        expected = expected if act is None else act(expected)
        out = conv_bn_act(layer.conv, layer.bn, act, x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert out.is_contiguous(memory_format=torch.channels_last)


def test_layer_norm_to_nchw_in_blocks_equals_the_plain_form():
    """Normalised and transposed block by block (a 70 x 70 x 64 map: two blocks, the second partial, and a
    batch of two): the plain form's values exactly, contiguous NCHW; with autograd the plain form itself."""
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(64, eps=1e-6)
    torch.nn.init.normal_(norm.weight)
    torch.nn.init.normal_(norm.bias)
    x = torch.randn(2, 70, 70, 64)
    expected = norm(x).permute(0, 3, 1, 2).contiguous()
    with torch.no_grad():
        out = layer_norm_to_nchw(norm, x)
    assert out.shape == (2, 64, 70, 70) and out.is_contiguous()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    grad_out = layer_norm_to_nchw(norm, x)
    assert grad_out.requires_grad and grad_out.is_contiguous()
    torch.testing.assert_close(grad_out, expected, rtol=0, atol=0)


def _ffn_plain(ffn, x):
    """The FFN written out on the whole map: ``fc2(h + dwconv(h))``, ``h = GELU(fc1(x))``."""
    hidden = ffn.act(ffn.fc1(x))
    return ffn.fc2(hidden + ffn.dwconv(hidden.permute(0, 3, 1, 2)).permute(0, 2, 3, 1))


@pytest.mark.parametrize('rows', [1, 3, 11])
def test_ffn_in_row_blocks_equals_the_whole_map(rows):
    """Row blocks with one halo row each side (1 row, 3 rows with a partial last block, the whole map;
    batch 2): the whole-map FFN's output."""
    torch.manual_seed(0)
    ffn = fuse_modules(_randomised(ConvFFN(8, 28)))
    x = torch.randn(2, 11, 7, 8)
    with torch.no_grad():
        out = ffn.forward_in_row_blocks(x, block_bytes=rows * 7 * 28 * 4)
        torch.testing.assert_close(out, _ffn_plain(ffn, x), rtol=1e-5, atol=1e-6)
    assert out.is_contiguous()


def test_ffn_takes_row_blocks_for_large_maps_in_inference_only(monkeypatch):
    torch.manual_seed(0)
    ffn = fuse_modules(_randomised(ConvFFN(8, 28)))
    calls = []
    forward_in_row_blocks = ffn.forward_in_row_blocks
    monkeypatch.setattr(ffn, 'forward_in_row_blocks', lambda x: calls.append(x.shape) or forward_in_row_blocks(x))
    monkeypatch.setattr('polaformerpp.ops.fusion.modules.FFN_ROW_BLOCKS_FROM_BYTES', 2 * 2**20)
    large = torch.randn(1, 160, 160, 8)  # a 2.7 MiB hidden map, over the threshold set above
    with torch.no_grad():
        torch.testing.assert_close(ffn(large), _ffn_plain(ffn, large), rtol=1e-5, atol=1e-5)
        ffn(large[:, :8, :8])  # small: the whole map
    ffn(large)  # autograd records: the whole map
    assert calls == [large.shape]


def test_fused_linear_act_and_when_fusion_applies():
    torch.manual_seed(0)
    linear, act = torch.nn.Linear(16, 64), torch.nn.GELU()
    x = torch.randn(2, 256, 256, 16)  # a 32 MiB output: the fused matmul
    with torch.no_grad():
        torch.testing.assert_close(linear_act(linear, act, x), act(linear(x)), rtol=1e-5, atol=1e-6)
    x = x[:, :4, :4]
    layer = ConvBN(4, 4)
    assert not inference_fusable(x, linear)  # grad mode: autograd records the parameters
    with torch.no_grad():
        assert inference_fusable(x, linear) == torch.backends.mkldnn.is_available()
        assert not inference_fusable(x.half(), linear)
        x4 = torch.zeros(1, 4, 3, 3)
        torch.testing.assert_close(conv_bn_act(layer.conv, layer.bn.train(), None, x4),
                                   layer.bn(layer.conv(x4)))  # BN in training mode: batch statistics, unfused
        with torch.autocast('cpu', dtype=torch.bfloat16):
            assert not inference_fusable(x, linear)


@pytest.mark.parametrize('C,heads,use_rope,H,W', [(32, 2, True, 6, 5), (36, 3, False, 4, 7), (64, 1, True, 9, 8)])
def test_linear_attention_trains_as_one_function_on_the_cpu(C, heads, use_rope, H, W):
    """The CPU training Function (packed gradient of in_proj, LePE and gate inside) against the module's
    plain form on the eager backend: output and every gradient. d = 16, 64 take the vector rows;
    C = 36 (d = 12) the scalar rows and oneDNN's conv weight gradient."""
    torch.manual_seed(C)
    fused = fuse_modules(_randomised(PolaLinearAttention(C, heads, use_rope=use_rope), seed=C))
    plain = _randomised(PolaLinearAttention(C, heads, use_rope=use_rope, backend='torch'), seed=C)
    x = torch.randn(2, H, W, C)
    outs, grads = [], []
    for module in (fused, plain):
        leaf = x.clone().requires_grad_(True)
        out = module(leaf)
        outs.append(out)
        grads.append(torch.autograd.grad((out * x.flip(-1)).sum(), [leaf, *module.parameters()]))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    for (name, _), a, b in zip([('x', None), *fused.named_parameters()], *grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=name)


def test_linear_attention_training_function_is_used_and_steps_aside():
    """In-range inputs run the Function; inputs needing exponent shifts take the plain form."""
    module = fuse_modules(PolaLinearAttention(32, 2))
    seen = []
    original = PolaLinearAttentionCPU.apply

    def spy(*args):
        seen.append(True)
        return original(*args)

    PolaLinearAttentionCPU.apply = spy
    try:
        module(torch.randn(1, 4, 4, 32)).sum().backward()
        assert seen == [True]
        with torch.no_grad():
            module.in_proj.bias[32:64] = 40.0  # keys far outside the shift-free range
        out = module(torch.randn(1, 4, 4, 32))
        assert seen == [True] and torch.isfinite(out).all()
        out.sum().backward()
    finally:
        PolaLinearAttentionCPU.apply = original
