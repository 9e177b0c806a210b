"""The label-swap gap (polaformerpp.generation.label_swap_gap) and its tool
tools/analysis_tools/label_swap_gap.py: an oracle that knows each class's image, a
model that ignores the label, and the command line on a checkpoint."""
import csv
import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import load_tool
from polaformerpp.generation import DiT, DiTDiffusion, conditioning_scales, label_swap_gap, wrong_labels
from polaformerpp.utils.cli import ArgumentCheckError

PIXEL_CONFIG = 'configs/generation/dit-tiny-4_polapp_1xb32-2k_demo-shapes-32.py'
TINY = ['model.dit.arch.hidden_size=32', 'model.dit.arch.depth=1', 'model.dit.arch.num_heads=2']


class PrototypeOracle(torch.nn.Module):
    """Predicts the noise exactly when ``x_0`` is the prototype image of the label (null: their mean)."""

    in_channels, learn_sigma, num_classes = 3, True, 4
    null_class = 4

    def __init__(self, prototypes, alphas_cumprod):
        super().__init__()
        self.y_embedder = DiT(dict(depth=1, hidden_size=8, num_heads=1, patch_size=2), input_size=2,
                              in_channels=3, num_classes=4).y_embedder  # dropout_prob 0.1: has a null class
        self.register_buffer('x0', torch.cat([prototypes, prototypes.mean(0, keepdim=True)]))
        self.register_buffer('abar', torch.as_tensor(alphas_cumprod, dtype=torch.float32))

    def forward(self, x, t, y):
        abar = self.abar[t].reshape(-1, 1, 1, 1)
        eps = (x - abar.sqrt() * self.x0[y]) / (1 - abar).sqrt()
        return torch.cat([eps, torch.zeros_like(eps)], dim=1)


def _prototypes(num=4, size=8, seed=0):
    """uint8 ``(num, 3, size, size)`` random images, one per class."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (num, 3, size, size), generator=gen, dtype=torch.uint8)


def test_wrong_labels_are_always_another_class():
    labels = torch.arange(10).repeat(50) % 5
    wrong = wrong_labels(labels, 5, torch.Generator().manual_seed(0))
    assert (wrong != labels).all() and wrong.min() >= 0 and wrong.max() < 5
    assert len(set(wrong[labels == 0].tolist())) == 4  # every other class is drawn
    with pytest.raises(ValueError, match='num_classes >= 2'):
        wrong_labels(labels, 1)


def test_gap_of_an_oracle_and_of_a_model_that_ignores_the_label():
    images = _prototypes()
    labels = torch.arange(4).repeat(3)
    model = DiTDiffusion(dit=dict(type='DiT', arch=dict(depth=1, hidden_size=32, num_heads=2, patch_size=2),
                                  input_size=8, in_channels=3, num_classes=4))
    oracle = DiTDiffusion(dit=PrototypeOracle(images.float() / 127.5 - 1, model.diffusion.alphas_cumprod))
    rows = label_swap_gap(oracle, images[labels], labels, [10, 500, 990], seed=1, batch_size=5)
    assert [r['timestep'] for r in rows] == [10, 500, 990]
    for r in rows:  # the right label gives the exact noise; a wrong one and the mean image do not
        assert r['loss_right'] < 1e-10 and r['loss_wrong'] > 1e-6 and r['loss_null'] > 1e-6
        assert r['gap_wrong'] == pytest.approx(r['loss_wrong'] - r['loss_right'])
        assert r['rel_gap_wrong'] > 1e3
    assert rows[0]['gap_wrong'] > rows[1]['gap_wrong'] > rows[2]['gap_wrong']  # x_0 matters less at high t

    # DiT's zero-initialised output: the same prediction whatever the label
    for r in label_swap_gap(model, images[labels], labels, [10, 500], seed=1):
        assert r['loss_right'] == r['loss_wrong'] == r['loss_null'] and r['gap_wrong'] == 0.0
        assert 0.5 < r['loss_right'] < 1.5  # the noise's mean square
    with pytest.raises(ValueError, match=r'timesteps must be a non-empty list in \[0, 999\]'):
        label_swap_gap(model, images, torch.arange(4), [1000])
    with pytest.raises(ValueError, match='class labels must be in'):
        label_swap_gap(model, images, torch.tensor([0, 1, 2, 7]), [10])


def test_conditioning_scales():
    net = DiT(dict(depth=1, hidden_size=64, num_heads=2, patch_size=2), input_size=8, in_channels=3,
              num_classes=4, label_embed_std=1.0)
    scales = conditioning_scales(net, [0, 500])
    assert scales['timesteps'] == [0, 500] and len(scales['t_emb_norm']) == 2
    assert 5 < scales['y_emb_norm'] < 11  # N(0, 1) rows in 64 dims: norm ~8
    assert scales['adaln_label_change'] == 0.0  # adaLN-Zero: no modulation before training
    with torch.no_grad():
        net.blocks[0].adaLN_modulation[-1].weight.normal_()
    assert conditioning_scales(net, [0, 500])['adaln_label_change'] > 0.1


@pytest.fixture(scope='module')
def image_folder(tmp_path_factory):
    """4 classes x 3 images (32x32) in ``val/`` with ``meta/val.txt``."""
    root = tmp_path_factory.mktemp('folder')
    lines = []
    protos = _prototypes(size=32).permute(0, 2, 3, 1).numpy()
    for label in range(4):
        os.makedirs(root / 'val' / str(label), exist_ok=True)
        for i in range(3):
            Image.fromarray(protos[label]).save(root / 'val' / str(label) / f'{i}.png')
            lines.append(f'{label}/{i}.png {label}')
    os.makedirs(root / 'meta', exist_ok=True)
    (root / 'meta' / 'val.txt').write_text('\n'.join(lines) + '\n')
    return str(root)


def test_tool_prints_and_writes_the_table(image_folder, tmp_path, capsys):
    tool = load_tool('tools/analysis_tools/label_swap_gap.py')
    from polaformerpp.apis import init_generator
    model = init_generator(PIXEL_CONFIG, cfg_options={k: int(v) for k, v in (o.split('=') for o in TINY)})
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ckpt = str(tmp_path / 'dit.pth')
    torch.save(dict(meta={}, state_dict=model.state_dict()), ckpt)
    out_csv, out_json = tmp_path / 'gap.csv', tmp_path / 'gap.json'
    argv = [PIXEL_CONFIG, ckpt, '--data-root', image_folder, '--timesteps', '100', '600', '--num-images', '8',
            '--out-csv', str(out_csv), '--out-json', str(out_json), '--cfg-options', *TINY]
    report = tool.main(argv)
    printed = capsys.readouterr().out
    assert 'label-swap gap, 8 test images' in printed and 'gap(w-r)' in printed and '|t_emb|' in printed
    with open(out_csv) as f:
        rows = list(csv.DictReader(f))
    assert [int(r['timestep']) for r in rows] == [100, 600]
    saved = json.loads(out_json.read_text())
    assert saved['num_images'] == 8 and saved['rows'] == report['rows']
    assert np.isclose(float(rows[1]['loss_wrong']), saved['rows'][1]['loss_wrong'])
    assert all(r['loss_right'] != r['loss_wrong'] for r in saved['rows'])  # random weights use the label
    assert tool.main(argv)['rows'] == report['rows']  # seeded: the same images, noise and wrong labels

    with pytest.raises(ArgumentCheckError, match=r'--timesteps must be in \[0, 999\]'):
        tool.main([*argv[:2], '--data-root', image_folder, '--timesteps', '1000', '--cfg-options', *TINY])
    with pytest.raises(ArgumentCheckError, match='--data-root: folder'):
        tool.main([*argv[:2], '--data-root', str(tmp_path / 'missing'), '--cfg-options', *TINY])
    with pytest.raises(ArgumentCheckError, match='checkpoint'):
        tool.main([PIXEL_CONFIG, str(tmp_path / 'missing.pth')])
