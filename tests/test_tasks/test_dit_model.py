"""DiT with PolaFormer++ or softmax attention: registry names, sizes and parameter counts,
forward pass, position embedding, the conditioning path (timestep embedding, embedder init,
label dropout), argument checks."""
import pytest
import torch
from mmengine.registry import DATASETS, METRICS, MODELS

from generation_testing import TINY_ARCH, randomize_, tiny_dit
from polaformerpp.generation import DIT_ARCHS, ClassImageFolder, DiT, GenerationFID, dit_param_count
from polaformerpp.generation.dit_layers import PolaTokenAttention, SoftmaxSelfAttention, timestep_embedding
from polaformerpp.generation.fused_layers import FusedPolaTokenAttention
from polaformerpp.models.layers import PolaLinearAttention
from polaformerpp.ops import available_backends
from polaformerpp.ops.fusion import unfuse_modules


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
    assert count == dit_param_count(name, attn_type='linear')


PUBLISHED_PARAMS = {'DiT-S/2': 33e6, 'DiT-B/2': 130e6, 'DiT-L/2': 458e6, 'DiT-XL/2': 675e6}


@pytest.mark.parametrize('name', sorted(PUBLISHED_PARAMS))
def test_param_counts_match_published_dit(name):
    counts = {}
    for attn_type in ('softmax', 'linear'):
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
    assert counts['linear'] - counts['softmax'] == spec['depth'] * (C * C + C + 26 * C + 4 * C)
    print(f"{name}: softmax {counts['softmax']:,}  linear {counts['linear']:,}")


@pytest.mark.parametrize('attn_type', ['linear', 'softmax'])
def test_tiny_dit_forward_zero_init_and_gradients(attn_type):
    net = tiny_dit(attn_type)
    x, t, y = torch.randn(3, 3, 8, 8), torch.tensor([0, 10, 999]), torch.tensor([0, 3, 4])
    out = net(x, t, y)
    assert out.shape == (3, 6, 8, 8)
    assert torch.count_nonzero(out) == 0  # adaLN-Zero and a zero output layer
    out.sum().backward()
    assert net.final_layer.linear.weight.grad.abs().sum() > 0
    attn_cls = PolaTokenAttention if attn_type == 'linear' else SoftmaxSelfAttention
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


def _autograd_node_names(tensor):
    names, stack, seen = set(), [tensor.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return names


def test_fused_dit_computes_the_plain_dits_outputs_and_gradients():
    """The DiT runs its token attention's fused form (by default; ``fused=False`` keeps the plain
    modules), which trains and infers as the plain one; unfusing gives back the plain classes."""
    fused = randomize_(tiny_dit())
    plain = tiny_dit(fused=False)
    plain.load_state_dict(fused.state_dict())
    assert all(type(b.attn) is FusedPolaTokenAttention for b in fused.blocks)
    assert all(type(b.attn) is PolaTokenAttention for b in plain.blocks)
    x, t, y = torch.randn(3, 3, 8, 8), torch.tensor([0, 10, 999]), torch.tensor([0, 3, 4])
    weights = torch.randn(3, 6, 8, 8)
    results = []
    for net in (fused, plain):
        torch.manual_seed(0)  # the same training-time label dropout in both
        out = net(x, t, y)
        results.append((out, torch.autograd.grad((out * weights).sum(), list(net.parameters())),
                        _autograd_node_names(out)))
    if 'cpu' in available_backends():  # the one-Function CPU training step of the attention
        assert 'PolaLinearAttentionCPUBackward' in results[0][2]
        assert 'PolaLinearAttentionCPUBackward' not in results[1][2]
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-5)
    for (name, _), a, b in zip(fused.named_parameters(), results[0][1], results[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    with torch.no_grad():
        torch.testing.assert_close(fused.eval()(x, t, y), plain.eval()(x, t, y), rtol=1e-5, atol=1e-5)
    unfuse_modules(fused)
    assert all(type(b.attn) is PolaTokenAttention for b in fused.blocks)


def test_pos_embed_is_fixed_sincos():
    net = tiny_dit()
    assert 'pos_embed' in dict(net.named_buffers()) and 'pos_embed' in net.state_dict()
    pe = net.pos_embed[0]  # (16, 32): first half columns, second half rows, each [sin | cos]
    assert pe.shape == (16, 32)
    torch.testing.assert_close(pe[:, :8], torch.sin(pe[:, :8].asin()))
    torch.testing.assert_close(pe[1, :8], torch.sin(torch.ones(8) / 10000 ** (torch.arange(8) / 8)))
    torch.testing.assert_close(pe[4, 16:24], pe[1, :8])  # row 1 at col 0 == col 1 at row 0


def test_timestep_embedding_is_dits():
    """256 frequencies ``10000 ** (-i / 128)``, laid out ``[cos | sin]``, fractional timesteps allowed."""
    t = torch.tensor([0.0, 1.0, 999.0, 12.5])
    emb = timestep_embedding(t, 256)
    freqs = 10000.0 ** (-torch.arange(128, dtype=torch.float64) / 128)
    args = t.double()[:, None] * freqs[None]
    torch.testing.assert_close(emb, torch.cat([args.cos(), args.sin()], dim=1).float(), atol=1e-4, rtol=0)  # fp32 args
    assert emb.shape == (4, 256) and timestep_embedding(t, 7).shape == (4, 7)


def test_conditioning_init_is_dits_and_the_label_scale_is_a_choice():
    """N(0, 0.02) label table and timestep MLP, zero adaLN and output layer; ``label_embed_std`` sets the table."""
    torch.manual_seed(0)
    net = DiT(dict(depth=2, hidden_size=256, num_heads=4, patch_size=2), input_size=8, in_channels=3,
              num_classes=100)
    table = net.y_embedder.embedding_table.weight
    assert table.shape == (101, 256) and abs(float(table.std()) - 0.02) < 0.002
    for layer in (net.t_embedder.mlp[0], net.t_embedder.mlp[2]):
        assert abs(float(layer.weight.std()) - 0.02) < 0.002
    for block in net.blocks:
        assert torch.count_nonzero(block.adaLN_modulation[-1].weight) == 0
    assert torch.count_nonzero(net.final_layer.linear.weight) == 0
    scaled = DiT(dict(depth=1, hidden_size=256, num_heads=4, patch_size=2), input_size=8, in_channels=3,
                 num_classes=100, label_embed_std=1.0)
    assert abs(float(scaled.y_embedder.embedding_table.weight.std()) - 1.0) < 0.05
    with pytest.raises(ValueError, match='label_embed_std must be a positive number'):
        DiT(TINY_ARCH, input_size=8, in_channels=3, num_classes=4, label_embed_std=0.0)


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



def test_dit_bad_inputs_get_clear_errors():
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
