"""polaformerpp.analysis: attention statistics on constructed q, k with known answers, the
recorder that captures q, k of every linear attention, temperatures and polarity mixing."""
import math

import pytest
import torch

from polaformerpp.analysis import (
    AttentionCapture,
    AttentionRecorder,
    attention_entropy,
    capture_entropy,
    pola_attention_weights,
    polarity_mixing,
    temperature_pairs,
)
from polaformerpp.models.layers import PolaLinearAttention
from polaformerpp.ops import pola_attention_torch, pola_rope_tables


def entropy_of(probs):
    return -sum(p * math.log(p) for p in probs if p > 0)


# --------------------------------------------------------------------------- entropy, known answers
def one_dominant_key(query_sign=1.0):
    """4 identical queries ``(+-1, 0)``; keys ``(3, 0)`` (dominant) and three ``(1, 0)``; temperatures 0.5."""
    q = torch.tensor([query_sign, 0.0], dtype=torch.float64).expand(1, 1, 4, 2).clone()
    k = torch.tensor([[3.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]], dtype=torch.float64)[None, None]
    temps = torch.full((1, 4), 0.5, dtype=torch.float64)
    return AttentionCapture(name='toy.attn', q=q, k=k, grid=(2, 2), temp_same=temps, temp_opp=temps.clone(),
                            use_rope=False)


def test_entropies_equal_hand_computed_values():
    stats = capture_entropy(one_dominant_key(), max_queries=None)
    e = math.e
    # PolaFormer++, same stream: phi_s(q) = (e^0.5 - 1, 0 | 0, 0), phi_k = (e^k+ - 1, 0 | 0, 0)
    # -> weights proportional to e^3 - 1 and three times e - 1
    dominant = (e**3 - 1) / (e**3 - 1 + 3 * (e - 1))
    pola = entropy_of([dominant] + [(1 - dominant) / 3] * 3)
    relu = entropy_of([3 / 6, 1 / 6, 1 / 6, 1 / 6])  # relu(q).relu(k) = 3, 1, 1, 1
    elu = entropy_of([9 / 24, 5 / 24, 5 / 24, 5 / 24])  # (2, 1).(4, 1) = 9, (2, 1).(2, 1) = 5
    s = math.exp(3 / math.sqrt(2)) + 3 * math.exp(1 / math.sqrt(2))
    softmax = entropy_of([math.exp(3 / math.sqrt(2)) / s] + [math.exp(1 / math.sqrt(2)) / s] * 3)
    assert relu == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(6))  # by hand
    for method, expected in (('pola-same', pola), ('relu', relu), ('elu+1', elu), ('softmax', softmax)):
        assert stats[method]['entropy'].item() == pytest.approx(expected, abs=1e-9), method
        assert stats[method]['normalized'].item() == pytest.approx(expected / math.log(4), abs=1e-9)
        assert stats[method]['negative_mass'].item() == 0.0
        assert stats[method]['zero_rows'].item() == 0
    # the channel-wise spiky feature map concentrates on the dominant key more than ReLU does
    assert dominant > 0.78 and pola < relu - 0.4
    assert pola < elu and pola < softmax
    # a positive query and positive keys share no opposite-signed pair: no opposite-stream weight
    assert math.isnan(stats['pola-opp']['entropy'].item())
    assert stats['pola-opp']['zero_rows'].item() == 4


def test_opposite_stream_of_a_negative_query():
    stats = capture_entropy(one_dominant_key(query_sign=-1.0), max_queries=None)
    e = math.e
    dominant = (e**3 - 1) / (e**3 - 1 + 3 * (e - 1))
    # phi_o(q) = (e^0.5 - 1, 0 | 0, 0): q- meets k+, the same weights as the same stream above
    assert stats['pola-opp']['entropy'].item() == pytest.approx(
        entropy_of([dominant] + [(1 - dominant) / 3] * 3), abs=1e-9)
    assert stats['pola-same']['zero_rows'].item() == 4
    assert stats['relu']['zero_rows'].item() == 4  # relu(q) = 0: ReLU attention has no weights at all


def test_signed_weights_enter_by_magnitude():
    weights = torch.tensor([[2.0, -1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    entropy, negative = attention_entropy(weights)
    assert entropy[0].item() == pytest.approx(1.5 * math.log(2))  # p = (1/2, 1/4, 1/4)
    assert negative[0].item() == pytest.approx(0.25)
    assert math.isnan(entropy[1].item()) and math.isnan(negative[1].item())
    assert entropy[2].item() == pytest.approx(math.log(2)) and negative[2].item() == 0.0


@pytest.mark.parametrize('with_rope', [False, True])
def test_effective_weights_reproduce_the_op(with_rope):
    torch.manual_seed(0)
    B, h, H, W, d = 2, 2, 3, 4, 8
    q, k, v = torch.randn(3, B, h, H * W, d, dtype=torch.float64).unbind(0)
    ts, to = torch.rand(2, h, 2 * d, dtype=torch.float64).unbind(0)
    rope = pola_rope_tables(H, W, d, dtype=torch.float64) if with_rope else None
    out = pola_attention_torch(q, k, v, ts, to, rope)
    index = torch.tensor([0, 5, 11])
    w_same, w_opp = pola_attention_weights(q, k, ts, to, rope, query_index=index)
    assert w_same.shape == (B, h, 3, H * W)
    torch.testing.assert_close(w_same @ v[..., :d // 2], out[..., index, :d // 2])
    torch.testing.assert_close(w_opp @ v[..., d // 2:], out[..., index, d // 2:])
    assert (w_same.min() < 0) == with_rope  # only the rotation makes weights negative
    _, negative = attention_entropy(w_same)
    assert (negative.max() > 0) == with_rope


def test_recorder_captures_each_linear_attention():
    torch.manual_seed(0)
    model = torch.nn.Sequential(PolaLinearAttention(16, 2), PolaLinearAttention(16, 4, use_rope=False))
    x = torch.randn(2, 3, 5, 16)
    with AttentionRecorder(model) as recorder:
        model(x)
    assert [c.name for c in recorder.captures] == ['0', '1']
    first = recorder.captures[0]
    q, k, _, _, _ = model[0].split_heads(x)
    torch.testing.assert_close(first.q, q.detach())
    torch.testing.assert_close(first.k, k.detach())
    assert first.grid == (3, 5) and first.use_rope and not recorder.captures[1].use_rope
    model(x)  # hooks are removed on exit
    assert len(recorder.captures) == 2
    stats = capture_entropy(first, max_queries=6)
    assert all(stats[m]['entropy'].shape == (2, ) for m in stats)
    assert (stats['softmax']['entropy'] <= math.log(15) + 1e-9).all()


def test_temperature_pairs_and_polarity_streams():
    module = PolaLinearAttention(8, 2)  # head dim 4
    with torch.no_grad():
        module.temp_same.copy_(torch.arange(16.0).view(2, 8))
        module.temp_opp.copy_(-torch.arange(16.0).view(2, 8))
    pairs = temperature_pairs(module)
    x, y = pairs['q+: same vs opp']
    # q+ of channel c: same stream s1[:, c], opposite stream s2[:, d + c]
    torch.testing.assert_close(x, torch.tensor([0., 1, 2, 3, 8, 9, 10, 11]).sigmoid())
    torch.testing.assert_close(y, (-torch.tensor([4., 5, 6, 7, 12, 13, 14, 15])).sigmoid())
    result = polarity_mixing(module)
    assert result['stream'].tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    assert result['coords'].shape == (8, 2)
    assert 0 < result['explained'].sum() <= 1 + 1e-6
