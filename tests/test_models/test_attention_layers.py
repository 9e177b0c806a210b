"""The token mixers and the block: one projection name, the head split, stochastic depth."""
import pytest
import torch

from polaformerpp.models.layers import PolaFormerBlock, PolaLinearAttention, RoPESoftmaxAttention


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
