"""Does a class-conditional DiT use its label? The label-swap gap and the conditioning scales.

:func:`label_swap_gap`: the denoising loss ``|eps - eps_hat(x_t, t, y)|^2`` of
held-out images at fixed timesteps with the right label, a wrong label and the
null label, on the *same* noise. A model that conditions denoises better with
the right label (``wrong - right > 0``); one that ignores the label gives three
equal losses. The quickest check that class conditioning works, long before
samples can be judged.

:func:`conditioning_scales`: norms of the timestep embedding (per timestep) and
of the label embeddings (and of their differences between classes), which
meet in ``c = t_emb + y_emb`` before every adaLN, plus how much the label
moves the first block's adaLN output.
"""
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from .sampling import sample_generators

__all__ = ['label_swap_gap', 'conditioning_scales', 'wrong_labels', 'format_gap_table']


def wrong_labels(labels: Tensor, num_classes: int, generator: Optional[torch.Generator] = None) -> Tensor:
    """A different class for every label: ``(y + k) mod K`` with ``k`` uniform in ``1 .. K-1``."""
    if num_classes < 2:
        raise ValueError(f'a wrong label needs num_classes >= 2, got {num_classes}')
    shift = torch.randint(1, num_classes, labels.shape, generator=generator)
    return (labels + shift.to(labels.device)) % num_classes


@torch.no_grad()
def label_swap_gap(model, images: Tensor, labels: Tensor, timesteps: Sequence[int], seed: int = 0,
                   batch_size: int = 64) -> List[Dict[str, float]]:
    """Denoising loss per timestep with the right, a wrong and the null label.

    Args:
        model: a :class:`~polaformerpp.generation.DiTDiffusion` (its ``dit`` is
            run in eval mode: no label dropout).
        images: uint8 ``(N, 3, H, W)`` held-out images.
        labels: ``(N,)`` their classes.
        timesteps: training-chain timesteps ``t`` in ``[0, T)``.
        seed: noise of image ``i`` at timestep ``t`` and its wrong label come
            from ``(seed, i)``: the three labels see the same ``x_t``.
        batch_size: images per forward.

    Returns:
        list of dict, one per timestep: ``timestep``, ``loss_right``,
        ``loss_wrong``, ``loss_null`` (NaN without a null class), ``gap_wrong``
        (``wrong - right``), ``gap_null`` (``null - right``), ``rel_gap_wrong``
        (``gap_wrong / right``). Losses are the noise MSE averaged over images
        and channels.
    """
    dit, diffusion = model.dit, model.diffusion
    labels = torch.as_tensor(labels, dtype=torch.long).reshape(-1)
    if images.dim() != 4 or images.shape[0] != labels.shape[0] or images.dtype != torch.uint8:
        raise ValueError(f'images must be uint8 (N, 3, H, W) with one label each, got {tuple(images.shape)} '
                         f'{images.dtype} and {labels.shape[0]} labels')
    T = diffusion.num_timesteps
    bad = [t for t in timesteps if not 0 <= int(t) < T]
    if bad or not len(timesteps):
        raise ValueError(f'timesteps must be a non-empty list in [0, {T - 1}], got {list(timesteps)}')
    model._check_labels(labels)
    has_null = dit.y_embedder.dropout_prob > 0
    device = next(dit.parameters()).device
    was_training = dit.training
    dit.eval()
    sums = {int(t): np.zeros(3) for t in timesteps}
    try:
        for start in range(0, images.shape[0], batch_size):
            idx = range(start, min(start + batch_size, images.shape[0]))
            gens = sample_generators(seed, idx)
            x0 = model.encode(images[start:idx.stop].to(device).float() / 127.5 - 1.0)
            y = labels[start:idx.stop].to(device)
            wrong = torch.stack([wrong_labels(y[j:j + 1].cpu(), dit.num_classes, g)[0]
                                 for j, g in enumerate(gens)]).to(device)
            variants = [y, wrong] + ([torch.full_like(y, dit.null_class)] if has_null else [])
            for t in timesteps:
                noise = torch.stack([torch.randn(x0.shape[1:], generator=g) for g in gens]).to(device, x0.dtype)
                tt = torch.full((x0.shape[0], ), int(t), device=device, dtype=torch.long)
                x_t = diffusion.q_sample(x0, tt, noise)
                n = len(variants)
                out = dit(torch.cat([x_t] * n), torch.cat([tt] * n), torch.cat(variants))
                eps = out[:, :x0.shape[1]].reshape(n, *x0.shape)
                mse = ((eps - noise.unsqueeze(0)) ** 2).flatten(2).mean(-1).sum(-1)  # (n,)
                sums[int(t)][:n] += mse.double().cpu().numpy()
    finally:
        dit.train(was_training)
    rows = []
    count = images.shape[0]
    for t in timesteps:
        right, wrong, null = sums[int(t)] / count
        null = null if has_null else float('nan')
        rows.append(dict(timestep=int(t), loss_right=float(right), loss_wrong=float(wrong), loss_null=float(null),
                         gap_wrong=float(wrong - right), gap_null=float(null - right),
                         rel_gap_wrong=float((wrong - right) / max(right, 1e-12))))
    return rows


@torch.no_grad()
def conditioning_scales(dit, timesteps: Sequence[int]) -> Dict[str, object]:
    """Norms of what the label and the timestep add to ``c = t_emb + y_emb``.

    Returns:
        dict: ``t_emb_norm`` (one per timestep), ``y_emb_norm`` (mean over the
        classes), ``y_emb_class_diff`` (mean ``|y_i - y_j|`` over class pairs),
        ``null_emb_norm`` (NaN without a null class), ``adaln_label_change``
        (mean over timesteps and class pairs of ``|adaLN(c_i) - adaLN(c_j)| /
        |adaLN(c_i)|`` in the first block: how much the label moves the
        modulation).
    """
    device = next(dit.parameters()).device
    t = torch.as_tensor(list(timesteps), dtype=torch.long, device=device)
    t_emb = dit.t_embedder(t)  # (T, C)
    table = dit.y_embedder.embedding_table.weight
    y_emb = table[:dit.num_classes]  # (K, C)
    diffs = torch.cdist(y_emb[None], y_emb[None])[0]
    K = y_emb.shape[0]
    pair_mean = float(diffs.sum() / max(K * (K - 1), 1))
    c = t_emb[:, None] + y_emb[None]  # (T, K, C)
    mod = dit.blocks[0].adaLN_modulation(c) if len(dit.blocks) else c
    change = torch.cdist(mod, mod) / mod.norm(dim=-1, keepdim=True).clamp(min=1e-12)  # (T, K, K)
    has_null = dit.y_embedder.dropout_prob > 0
    return dict(timesteps=[int(s) for s in timesteps],
                t_emb_norm=[float(v) for v in t_emb.norm(dim=-1)],
                y_emb_norm=float(y_emb.norm(dim=-1).mean()),
                y_emb_class_diff=pair_mean,
                null_emb_norm=float(table[dit.num_classes].norm()) if has_null else float('nan'),
                adaln_label_change=float(change.sum() / max(len(t) * K * (K - 1), 1)))


def format_gap_table(rows: List[Dict[str, float]]) -> str:
    """The rows of :func:`label_swap_gap` as a fixed-width text table."""
    header = f"{'timestep':>8}  {'right':>10}  {'wrong':>10}  {'null':>10}  {'gap(w-r)':>10}  " \
             f"{'gap(n-r)':>10}  {'rel gap':>8}"
    lines = [header, '-' * len(header)]
    for r in rows:
        lines.append(f"{r['timestep']:>8d}  {r['loss_right']:>10.5f}  {r['loss_wrong']:>10.5f}  "
                     f"{r['loss_null']:>10.5f}  {r['gap_wrong']:>10.5f}  {r['gap_null']:>10.5f}  "
                     f"{100 * r['rel_gap_wrong']:>7.1f}%")
    return '\n'.join(lines)
