"""Shared pieces of the generation tests: config paths, a tiny DiT, a generated image set.

Imported by the ``test_*`` files of this folder (``from generation_testing import ...``).
"""
import os
import os.path as osp
import zipfile

import numpy as np
import torch

from polaformerpp.generation import DiT, DiTDiffusion

PIXEL_CONFIG = 'configs/generation/dit-tiny-4_polapp_1xb32-2k_demo-shapes-32.py'
DIGITS_CONFIG = 'configs/generation/dit-tiny-4_polapp_1xb32-2k_demo-digits-16.py'
#: the published-name configs: the authors' run-s.sh (100 epochs) and run-b/-l.sh (90; XL likewise)
LATENT_CONFIGS = {size: f'configs/generation/dit-{size}-2_polapp_8xb32-{epochs}e_in1k-256.py'
                  for size, epochs in (('s', 100), ('b', 90), ('l', 90), ('xl', 90))}
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


def read_npz_like_adm(path, name='arr_0', batch=3):
    """Read array ``name`` of an ``.npz`` as ADM's ``evaluations/evaluator.py`` streams it.

    The zip member ``<name>.npy`` is opened inside the archive, its ``.npy``
    header read (format 1.0 or 2.0, C order, no objects: the evaluator's
    streaming path) and the data read in raw batches of ``batch`` images.
    """
    with open(path, 'rb') as f, zipfile.ZipFile(f, 'r') as archive:
        assert f'{name}.npy' in archive.namelist(), f'{path}: no {name}'
        with archive.open(f'{name}.npy', 'r') as member:
            version = np.lib.format.read_magic(member)
            assert version in ((1, 0), (2, 0)), version
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran_order, dtype = read_header(member)
            assert not fortran_order and not dtype.hasobject
            per_item = int(np.prod(shape[1:])) * dtype.itemsize
            chunks = []
            for start in range(0, shape[0], batch):
                count = min(batch, shape[0] - start)
                data = member.read(count * per_item)
                assert len(data) == count * per_item, 'truncated array data'
                chunks.append(np.frombuffer(data, dtype).reshape(count, *shape[1:]))
    return np.concatenate(chunks)
