"""Shared pieces of the generation tests: config paths, a tiny DiT, a generated image set.

Imported by the ``test_*`` files of this folder (``from generation_testing import ...``).
"""
import os
import os.path as osp

import numpy as np
import torch

from polaformerpp.generation import DiT, DiTDiffusion

PIXEL_CONFIG = 'configs/generation/dit-tiny-4_polapp_1xb32-2k_demo-shapes-32.py'
DIGITS_CONFIG = 'configs/generation/dit-tiny-4_polapp_1xb32-2k_demo-digits-16.py'
LATENT_CONFIGS = {size: f'configs/generation/dit-{size}-2_polapp_8xb32-400k_in1k-256.py'
                  for size in ('s', 'b', 'l', 'xl')}
TINY_ARCH = dict(depth=2, hidden_size=32, num_heads=2, patch_size=2)


def tiny_dit(attn_type='linear', **kwargs):
    """A 2-block DiT on ``(B, 3, 8, 8)`` pixels with 4 classes (zero-initialised as DiT is)."""
    kwargs = dict(dict(input_size=8, in_channels=3, num_classes=4), **kwargs)
    return DiT(TINY_ARCH, attn_type=attn_type, **kwargs)


def randomize_(module, seed=0, std=0.2):
    """Overwrite every parameter (DiT zero-initialises adaLN and the output layer)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * std)
    return module


def tiny_model(attn_type='linear', **sample_cfg):
    """:class:`DiTDiffusion` around a randomised tiny DiT, in eval mode, 3-step DDIM by default."""
    model = DiTDiffusion(dit=dict(type='DiT', arch=TINY_ARCH, input_size=8, in_channels=3,
                                  num_classes=4, attn_type=attn_type),
                         sample_cfg=dict(dict(num_steps=3, sampler='ddim'), **sample_cfg))
    randomize_(model.dit)
    return model.eval()


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
