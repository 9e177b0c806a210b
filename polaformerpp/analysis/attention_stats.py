"""What PolaFormer++ attention does on real inputs: weights, entropy, temperatures, mixing.

The analysis tools (``tools/analysis_tools/attention_entropy.py``,
``vis_temperatures.py``, ``vis_polarity_mixing.py``, ``vis_attention_maps.py``)
are thin command lines over this module.

Effective attention weights
---------------------------
Linear attention never forms the ``N x N`` matrix, but its output is still a
weighted sum of the values, so the matrix exists and can be formed for
analysis. For one head with queries/keys ``q, k`` ``(N, d)`` and the feature
maps of :func:`polaformerpp.ops.pola_feature_maps` (``phi_s``, ``phi_o``,
``phi_k``, each ``(N, 2d)``), :func:`polaformerpp.ops.pola_attention` computes

    out_same[i] = sum_j W_same[i, j] v[j, :d/2]
    out_opp[i]  = sum_j W_opp[i, j]  v[j, d/2:]
    W_s[i, j] = <R phi_s[i], R phi_k[j]> / (N * (<phi_s[i], mean_j phi_k[j]> + eps))

(``W_opp`` with ``phi_o``; ``R`` the 2-D RoPE, identity without it).
:func:`pola_attention_weights` (the op's quadratic reference form, from
:mod:`polaformerpp.ops.pola_attention.naive`) returns exactly these matrices
(``W @ v`` reproduces the op's output). The two polarity streams are two attention
distributions over the same keys, reported separately as ``pola-same`` and
``pola-opp``.

The baselines use the same ``q, k``: softmax ``softmax(q k^T / sqrt(d))``;
ReLU linear attention ``relu(q) relu(k)^T`` and 1+ELU linear attention
``(elu(q)+1) (elu(k)+1)^T``, each divided by its row sum (neither uses RoPE).

Normalised weights and entropy
------------------------------
Without RoPE every weight is >= 0 and a row of ``W`` sums to
``<phi_q, m> / (<phi_q, m> + eps)``, i.e. 1 up to ``eps``. RoPE rotates the
numerator only, so rows no longer sum to 1 and single weights can be
negative. Every method's row is therefore turned into a distribution the same
way, by magnitude::

    p[i, j] = |W[i, j]| / sum_j |W[i, j]|          H[i] = -sum_j p[i, j] log p[i, j]

(natural log, nats; ``0 log 0 = 0``; the row's positive scale, e.g. the
denominator above, cancels). For non-negative methods this is plain
normalisation. How much of a row's weight RoPE made negative is reported
beside the entropy as the negative-mass fraction
``sum_j max(-W[i, j], 0) / sum_j |W[i, j]|`` (0 for every method without RoPE).
A row whose weights are all zero (e.g. ReLU attention for a query with no
positive channel overlapping any key's, or an opposite-polarity stream with no
opposite-signed pair) has no distribution: its entropy is NaN and it is left
out of averages, and the number of such rows is reported. ``log N`` (uniform
attention) is the maximum; ``H / log N`` compares layers of different ``N``.
"""
import math
import os.path as osp
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from polaformerpp.models.layers import PolaLinearAttention
from polaformerpp.ops import pola_rope_tables
from polaformerpp.ops.pola_attention import pola_attention_weights
from polaformerpp.utils.progress import track

__all__ = [
    'METHODS', 'AttentionCapture', 'AttentionRecorder', 'attention_entropy', 'attention_weights',
    'pola_attention_weights', 'softmax_attention_weights', 'kernel_attention_weights',
    'capture_entropy', 'entropy_table', 'format_entropy_table', 'query_indices',
    'temperature_pairs', 'temperature_summary', 'polarity_mixing', 'attention_map',
    'pola_attention_modules', 'load_model', 'load_images', 'run_model', 'short_layer_name',
    'agg_pyplot'
]

#: attention distributions compared by the tools
METHODS = ('pola-same', 'pola-opp', 'softmax', 'relu', 'elu+1')


# --------------------------------------------------------------------------- weights
def kernel_attention_weights(q: Tensor, k: Tensor, kernel: str) -> Tensor:
    """Row-normalised weights of kernel linear attention ``phi(q) phi(k)^T``.

    Args:
        q: ``(..., Nq, d)``; k: ``(..., Nk, d)``.
        kernel: ``'relu'`` (``relu(x)``) or ``'elu+1'`` (``elu(x) + 1``).

    Returns:
        Tensor: ``(..., Nq, Nk)``; rows sum to 1, or are all zero where no key
        overlaps the query (ReLU only).
    """
    if kernel == 'relu':
        fq, fk = F.relu(q), F.relu(k)
    elif kernel == 'elu+1':
        fq, fk = F.elu(q) + 1, F.elu(k) + 1
    else:
        raise ValueError(f"kernel must be 'relu' or 'elu+1', got {kernel!r}")
    scores = fq @ fk.transpose(-1, -2)
    total = scores.sum(-1, keepdim=True)
    return torch.where(total > 0, scores / total.clamp_min(torch.finfo(scores.dtype).tiny), 0.0)


def softmax_attention_weights(q: Tensor, k: Tensor, scale: Optional[float] = None) -> Tensor:
    """``softmax(q k^T * scale)`` (``scale = d^-1/2`` by default): ``(..., Nq, Nk)``."""
    scale = q.shape[-1]**-0.5 if scale is None else scale
    return torch.softmax((q @ k.transpose(-1, -2)) * scale, dim=-1)


def attention_entropy(weights: Tensor) -> Tuple[Tensor, Tensor]:
    """Entropy (nats) of each row of ``weights`` and its negative-mass fraction.

    The row is normalised by magnitude, ``p = |w| / sum |w|`` (see the module
    docstring); rows with no weight at all give NaN in both outputs.

    Args:
        weights: ``(..., Nk)``.

    Returns:
        tuple[Tensor, Tensor]: entropy and ``sum max(-w, 0) / sum |w|``, each ``(...)``.
    """
    magnitude = weights.abs()
    total = magnitude.sum(-1, keepdim=True)
    valid = total > 0
    p = magnitude / torch.where(valid, total, torch.ones_like(total))
    entropy = -torch.special.xlogy(p, p).sum(-1)
    negative = (weights.clamp(max=0).abs().sum(-1, keepdim=True) /
                torch.where(valid, total, torch.ones_like(total)))
    nan = torch.full_like(entropy, float('nan'))
    valid = valid.squeeze(-1)
    return torch.where(valid, entropy, nan), torch.where(valid, negative.squeeze(-1), nan)


# --------------------------------------------------------------------------- captures
@dataclass
class AttentionCapture:
    """The queries and keys one :class:`PolaLinearAttention` module saw in a forward pass.

    Attributes:
        name: the module's name in the model (``named_modules``).
        q, k: ``(B, h, N, d)`` (fp32, CPU, detached).
        grid: ``(H, W)`` token grid, ``N = H * W`` (row-major).
        temp_same, temp_opp: ``(h, 2d)`` temperatures after the sigmoid.
        use_rope: whether the module rotates its numerator.
    """
    name: str
    q: Tensor
    k: Tensor
    grid: Tuple[int, int]
    temp_same: Tensor
    temp_opp: Tensor
    use_rope: bool

    @property
    def num_heads(self) -> int:
        return self.q.shape[1]

    @property
    def num_tokens(self) -> int:
        return self.q.shape[2]

    @property
    def head_dim(self) -> int:
        return self.q.shape[3]

    def rope_tables(self, dtype=torch.float32) -> Tuple[Tensor, Tensor]:
        """The module's RoPE ``(sin, cos)`` for this grid."""
        return pola_rope_tables(*self.grid, self.head_dim, dtype=dtype)


def pola_attention_modules(model: nn.Module) -> List[Tuple[str, PolaLinearAttention]]:
    """``(name, module)`` of every PolaFormer++ linear attention in ``model``, in order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, PolaLinearAttention)]


def _grid_input(module: PolaLinearAttention, args) -> Tensor:
    """The ``(B, H, W, C)`` feature map a module was called with.

    Inputs are ``(B, H, W, C)`` feature maps or, for token-sequence subclasses
    called as ``forward(x (B, N, C), grid)``, a sequence and its grid.
    """
    x = args[0]
    if x.dim() == 3:
        if len(args) < 2:
            raise ValueError(f'{type(module).__name__} got a (B, N, C) input without its grid')
        grid = tuple(int(s) for s in args[1])
        return x.reshape(x.shape[0], grid[0], grid[1], x.shape[-1])
    if x.dim() != 4:
        raise ValueError(f'expected a (B, H, W, C) input to {type(module).__name__}, '
                         f'got shape {tuple(x.shape)}')
    return x


class AttentionRecorder:
    """Context manager recording q, k of every PolaFormer++ attention during forward passes.

    Forward pre-hooks recompute the module's projection on its input through
    :meth:`PolaLinearAttention.split_heads` (the model classes are unchanged).
    Each call of each module appends one :class:`AttentionCapture` to
    :attr:`captures`.

    Example::

        with AttentionRecorder(model) as recorder:
            run_model(model, images)
        for cap in recorder.captures: ...
    """

    def __init__(self, model: nn.Module):
        self.modules = pola_attention_modules(model)
        if not self.modules:
            raise ValueError(f'{type(model).__name__} has no PolaLinearAttention module to analyse '
                             f'(e.g. a backbone with attn_types all softmax)')
        self.captures: List[AttentionCapture] = []
        self._handles = []

    def _hook(self, name: str):
        def hook(module, args):
            with torch.no_grad():
                x = _grid_input(module, args)
                q, k = module.split_heads(x)[:2]
                grid = (x.shape[1], x.shape[2])
                self.captures.append(
                    AttentionCapture(
                        name=name, q=q.detach().float().cpu(), k=k.detach().float().cpu(), grid=grid,
                        temp_same=module.temp_same.detach().sigmoid().float().cpu(),
                        temp_opp=module.temp_opp.detach().sigmoid().float().cpu(),
                        use_rope=bool(module.use_rope)))
        return hook

    def __enter__(self):
        self._handles = [m.register_forward_pre_hook(self._hook(name)) for name, m in self.modules]
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles = []
        return False


# --------------------------------------------------------------------------- entropy
def query_indices(num_tokens: int, max_queries: Optional[int]) -> Tensor:
    """All queries, or ``max_queries`` evenly spaced over the (row-major) grid."""
    if max_queries is None or num_tokens <= max_queries:
        return torch.arange(num_tokens)
    if max_queries < 1:
        raise ValueError(f'max_queries must be >= 1, got {max_queries}')
    return torch.linspace(0, num_tokens - 1, max_queries).round().long().unique()


def attention_weights(capture: AttentionCapture, method: str, query_index: Optional[Tensor] = None,
                      rope: Optional[bool] = None, dtype=torch.float64) -> Tensor:
    """Weights ``(B, h, Nq, N)`` of ``method`` (one of :data:`METHODS`) on the capture's q, k.

    ``rope`` (PolaFormer++ only): rotate as the module does (None), or force on/off.
    """
    q, k = capture.q.to(dtype), capture.k.to(dtype)
    if method in ('pola-same', 'pola-opp'):
        use_rope = capture.use_rope if rope is None else rope
        tables = capture.rope_tables(dtype) if use_rope else None
        same, opp = pola_attention_weights(q, k, capture.temp_same, capture.temp_opp, tables,
                                           query_index=query_index)
        return same if method == 'pola-same' else opp
    if query_index is not None:
        q = q[..., query_index, :]
    if method == 'softmax':
        return softmax_attention_weights(q, k)
    if method in ('relu', 'elu+1'):
        return kernel_attention_weights(q, k, method)
    raise ValueError(f'method must be one of {METHODS}, got {method!r}')


def capture_entropy(capture: AttentionCapture, methods: Sequence[str] = METHODS,
                    max_queries: Optional[int] = 1024, rope: Optional[bool] = None,
                    max_elements: int = 1 << 23) -> Dict[str, Dict[str, Tensor]]:
    """Per-head statistics of each method's attention rows for one capture.

    Rows are taken over all images of the batch and ``max_queries`` evenly
    spaced queries (all when ``None``), computed in chunks of at most
    ``max_elements`` weights.

    Returns:
        dict: ``method -> dict(entropy, normalized, negative_mass, zero_rows)``,
        each a ``(h,)`` tensor: mean entropy (nats) over the rows with weight,
        that divided by ``log N``, mean negative-mass fraction, and the number
        of rows without any weight.
    """
    index = query_indices(capture.num_tokens, max_queries)
    B, h, N = capture.q.shape[:3]
    chunk = max(1, max_elements // (B * h * N))
    result = {}
    for method in methods:
        entropies, negatives = [], []
        for start in range(0, len(index), chunk):
            weights = attention_weights(capture, method, index[start:start + chunk], rope)
            entropy, negative = attention_entropy(weights)  # (B, h, chunk)
            entropies.append(entropy)
            negatives.append(negative)
        entropy = torch.cat(entropies, -1).transpose(0, 1).reshape(h, -1)
        negative = torch.cat(negatives, -1).transpose(0, 1).reshape(h, -1)
        mean_entropy = entropy.nanmean(-1)
        result[method] = dict(
            entropy=mean_entropy,
            normalized=mean_entropy / math.log(N) if N > 1 else torch.zeros_like(mean_entropy),
            negative_mass=negative.nanmean(-1),
            zero_rows=entropy.isnan().sum(-1))
    return result


def entropy_table(captures: Iterable[AttentionCapture], methods: Sequence[str] = METHODS,
                  max_queries: Optional[int] = 1024, rope: Optional[bool] = None,
                  progress: Optional[bool] = False) -> List[dict]:
    """One row per (layer call, head): ``layer, head, tokens, <method>, <method>/norm,
    <method>/neg, <method>/zero`` (floats, NaN where a head has no row with weight).

    ``progress``: a bar over the layers on stderr (``False`` none, ``None`` when
    stderr is a terminal, ``True`` always; see :mod:`polaformerpp.utils.progress`).
    """
    rows = []
    for capture in track(captures, desc='attention entropy per layer', enabled=progress):
        stats = capture_entropy(capture, methods, max_queries, rope)
        for head in range(capture.num_heads):
            row = dict(layer=capture.name, head=head, tokens=capture.num_tokens)
            for method in methods:
                row[method] = float(stats[method]['entropy'][head])
                row[f'{method}/norm'] = float(stats[method]['normalized'][head])
                row[f'{method}/neg'] = float(stats[method]['negative_mass'][head])
                row[f'{method}/zero'] = int(stats[method]['zero_rows'][head])
            rows.append(row)
    return rows


def format_entropy_table(rows: Sequence[dict], methods: Sequence[str] = METHODS) -> str:
    """Plain-text table: entropy (nats) per method, ``log N``, PolaFormer++'s negative mass."""
    neg_methods = [m for m in methods if m.startswith('pola')]
    header = (['layer', 'head', 'N', 'log N'] + list(methods) +
              [f'neg {m[5:]}' for m in neg_methods] + ['zero rows'])
    lines = []
    for row in rows:
        zero = ', '.join(f'{m}:{row[f"{m}/zero"]}' for m in methods if row[f'{m}/zero'])
        lines.append([short_layer_name(row['layer']), str(row['head']), str(row['tokens']),
                      f"{math.log(row['tokens']):.3f}"] + [f'{row[m]:.3f}' for m in methods] +
                     [f"{row[f'{m}/neg']:.3f}" for m in neg_methods] + [zero or '-'])
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
              for i, h in enumerate(header)]

    def fmt(cells):
        return '  '.join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return '\n'.join([fmt(header), fmt(['-' * w for w in widths])] + [fmt(line) for line in lines])


def short_layer_name(name: str) -> str:
    """``'backbone.stages.0.blocks.1.attn'`` -> ``'stages.0.blocks.1'``."""
    for prefix in ('backbone.', 'network.', 'dit.'):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name[:-len('.attn')] if name.endswith('.attn') else name


# --------------------------------------------------------------------------- maps
def attention_map(capture: AttentionCapture, method: str, query: Tuple[int, int],
                  image: int = 0, head: Optional[int] = None,
                  rope: Optional[bool] = None) -> Tensor:
    """Where one query looks: the normalised distribution ``|w| / sum |w|`` over the key grid.

    Args:
        query: ``(row, col)`` on the capture's token grid.
        image: batch index.
        head: one head, or the mean over heads (None).

    Returns:
        Tensor: ``(H, W)`` float64, summing to 1 (zeros if the row has no weight).
    """
    H, W = capture.grid
    row, col = query
    if not (0 <= row < H and 0 <= col < W):
        raise ValueError(f'query {query} is outside the {H}x{W} token grid of {capture.name}')
    if head is not None and not 0 <= head < capture.num_heads:
        raise ValueError(f'head must be in [0, {capture.num_heads}) for {capture.name}, got {head}')
    weights = attention_weights(capture, method, torch.tensor([row * W + col]), rope)[image, :, 0]
    magnitude = weights.abs()
    total = magnitude.sum(-1, keepdim=True)
    p = torch.where(total > 0, magnitude / total.clamp_min(torch.finfo(total.dtype).tiny), 0.0)
    p = p.mean(0) if head is None else p[head]
    return p.reshape(H, W)


# --------------------------------------------------------------------------- parameters
def temperature_pairs(module: PolaLinearAttention) -> Dict[str, Tuple[Tensor, Tensor]]:
    """The learned temperatures of one module, paired per query channel.

    With ``ts = sigmoid(s1)``, ``to = sigmoid(s2)`` (``(h, 2d)``), the same
    stream scales ``[q+, q-]`` by ``ts`` and the opposite stream ``[q-, q+]`` by
    ``to``, so query channel ``c`` (``0 <= c < d``) has four temperatures:
    ``ts[c]`` (same, q+), ``ts[d+c]`` (same, q-), ``to[d+c]`` (opposite, q+),
    ``to[c]`` (opposite, q-).

    Returns:
        dict of ``(x, y)`` pairs, each ``(h*d,)``:
        ``'q+: same vs opp'``, ``'q-: same vs opp'`` (same-stream temperature
        vs opposite-stream temperature of one polarity) and ``'same: q+ vs q-'``,
        ``'opp: q+ vs q-'`` (q+ half vs q- half of one stream).
    """
    d = module.head_dim
    ts = module.temp_same.detach().float().sigmoid().cpu()
    to = module.temp_opp.detach().float().sigmoid().cpu()
    same_pos, same_neg = ts[:, :d].flatten(), ts[:, d:].flatten()
    opp_neg, opp_pos = to[:, :d].flatten(), to[:, d:].flatten()
    return {
        'q+: same vs opp': (same_pos, opp_pos),
        'q-: same vs opp': (same_neg, opp_neg),
        'same: q+ vs q-': (same_pos, same_neg),
        'opp: q+ vs q-': (opp_pos, opp_neg),
    }


def temperature_summary(pairs: Dict[str, Tuple[Tensor, Tensor]]) -> Dict[str, Dict[str, float]]:
    """Spread away from ``y = x`` of each pair: means, ``mean|x-y|``, ``max|x-y|``, ``P(y > x)``, stds."""
    summary = {}
    for key, (x, y) in pairs.items():
        gap = (x - y).abs()
        summary[key] = dict(mean_x=float(x.mean()), mean_y=float(y.mean()),
                            std_x=float(x.std(unbiased=False)), std_y=float(y.std(unbiased=False)),
                            mean_abs_gap=float(gap.mean()),
                            max_abs_gap=float(gap.max()), frac_above=float((y > x).float().mean()))
    return summary


def polarity_mixing(module: PolaLinearAttention, num_components: int = 2) -> Dict[str, object]:
    """How the output projection mixes the same- and opposite-polarity halves of the attention output.

    The op writes each head's ``d`` output channels as ``[same stream (d/2) |
    opposite stream (d/2)]``; after the LePE term and the gate, ``proj``
    (``Linear(C, C)``) maps them to the block's output, so column ``c`` of
    ``proj.weight`` is how input channel ``c`` is mixed (the paper's ``G_s``,
    ``G_o``). The columns (``C`` points in ``R^C``) are projected onto their
    principal components.

    Returns:
        dict: ``coords`` ``(C, num_components)``, ``stream`` ``(C,)`` (0 same, 1
        opposite), ``explained`` (variance ratio per component), ``norm_same``,
        ``norm_opp`` (mean column norm per stream) and ``separation`` (distance
        between the two streams' column means over the RMS spread of the
        columns around their own stream's mean, in the full space).
    """
    weight = module.proj.weight.detach().double().cpu()  # (C_out, C_in)
    columns = weight.t()  # (C_in, C_out)
    d = module.head_dim
    stream = ((torch.arange(columns.shape[0]) % d) >= d // 2).long()
    centred = columns - columns.mean(0, keepdim=True)
    _, singular, vh = torch.linalg.svd(centred, full_matrices=False)
    # components beyond the rank of the columns are zero
    coords = torch.zeros(columns.shape[0], num_components, dtype=columns.dtype)
    explained = torch.zeros(num_components, dtype=columns.dtype)
    used = min(num_components, vh.shape[0])
    coords[:, :used] = centred @ vh[:used].t()
    variance = singular**2
    explained[:used] = variance[:used] / variance.sum().clamp_min(1e-300)
    mean_same, mean_opp = columns[stream == 0].mean(0), columns[stream == 1].mean(0)
    spread = torch.cat([columns[stream == 0] - mean_same, columns[stream == 1] - mean_opp])
    rms = spread.pow(2).sum(-1).mean().sqrt()
    return dict(coords=coords.float(), stream=stream, explained=explained.float(),
                norm_same=float(columns[stream == 0].norm(dim=-1).mean()),
                norm_opp=float(columns[stream == 1].norm(dim=-1).mean()),
                separation=float((mean_same - mean_opp).norm() / rms.clamp_min(1e-12)))


# --------------------------------------------------------------------------- model access
class _DiTOnly(nn.Module):
    """The noise predictor of a ``DiTDiffusion`` config without its (external) VAE."""

    def __init__(self, dit: nn.Module):
        super().__init__()
        self.dit = dit


def load_model(config, checkpoint: Optional[str] = None, cfg_options: Optional[dict] = None, device: str = 'cpu',
               allow_partial: bool = False, unsafe_load: bool = False) -> nn.Module:
    """Build the model of a config (its scope and custom imports), load a checkpoint, eval mode.

    The checkpoint loads safely (``weights_only=True``; ``unsafe_load`` for a
    trusted file that needs full unpickling) and strictly: unfilled,
    unexpected or mis-shaped tensors raise
    :class:`~polaformerpp.utils.CheckpointMismatchError` unless ``allow_partial``.

    A config's top-level ``data_preprocessor`` is merged into the model as the
    Runner does. For a diffusion config (``model.dit``) only the DiT is built
    (the frozen VAE is not part of the checkpoint), loaded from ``dit.*``.
    """
    from mmengine.config import Config
    from mmengine.registry import MODELS, init_default_scope

    from polaformerpp.utils.checkpoint import load_model_weights

    cfg = Config.fromfile(config) if isinstance(config, str) else config
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    scope = cfg.get('default_scope', None)
    if scope is not None:
        init_default_scope(scope)
    if 'custom_imports' in cfg:
        from mmengine.utils import import_modules_from_strings
        import_modules_from_strings(**cfg.custom_imports)
    model_cfg = cfg.model.copy()
    model_cfg.pop('pretrained', None)
    if 'dit' in model_cfg:
        model = _DiTOnly(MODELS.build(model_cfg.dit))
    else:
        if cfg.get('data_preprocessor') is not None:
            model_cfg.setdefault('data_preprocessor', cfg.data_preprocessor)
        backbone = model_cfg.get('backbone')
        if isinstance(backbone, dict) and isinstance(backbone.get('init_cfg'), dict) and checkpoint:
            backbone['init_cfg'] = None  # the checkpoint holds the whole model
        model = MODELS.build(model_cfg)
    if checkpoint is not None:
        if not osp.isfile(checkpoint):
            raise FileNotFoundError(f'checkpoint not found: {checkpoint}')
        load_model_weights(model, checkpoint, allow_partial=allow_partial, unsafe=True if unsafe_load else None)
    return model.to(device).eval()


def load_images(paths: Sequence[str] = (), shape: Tuple[int, int] = (224, 224), num_random: int = 1,
                seed: int = 0) -> Tuple[List[Tensor], List[str]]:
    """Images as uint8 ``(3, H, W)`` BGR tensors (the OpenMMLab loading convention), resized to ``shape``.

    ``paths`` may name image files or folders (their images, sorted). Without
    paths, ``num_random`` uniform-noise images are made (``seed``).

    Returns:
        tuple: the images and their names.
    """
    import mmcv
    files = []
    for path in paths:
        if osp.isdir(path):
            from mmengine.utils import scandir
            files += [osp.join(path, f) for f in sorted(scandir(path, ('.jpg', '.jpeg', '.png', '.bmp'),
                                                                 recursive=True))]
        elif osp.isfile(path):
            files.append(path)
        else:
            raise FileNotFoundError(f'image not found: {path}')
    if paths and not files:
        raise FileNotFoundError(f'no image files under {list(paths)}')
    height, width = shape
    if files:
        images = [torch.from_numpy(mmcv.imresize(mmcv.imread(f, 'color'), (width, height),
                                                 interpolation='bicubic')).permute(2, 0, 1).contiguous()
                  for f in files]
        return images, files
    generator = torch.Generator().manual_seed(seed)
    images = [torch.randint(0, 256, (3, height, width), generator=generator, dtype=torch.uint8)
              for _ in range(num_random)]
    return images, [f'random-{i}' for i in range(num_random)]


def run_model(model: nn.Module, images: Sequence[Tensor], timestep: int = 500) -> None:
    """One inference forward of the attention-carrying part of ``model`` on uint8 images.

    Images go through the model's data preprocessor (normalisation, BGR->RGB as
    configured); then classifiers, detectors and segmentors run
    ``extract_feat`` (their backbone and neck), other models (e.g. SR) their
    tensor-mode forward. A DiT runs one denoising step at ``timestep`` on
    Gaussian latents (class 0), one per image.
    """
    device = next(model.parameters()).device
    with torch.no_grad():
        if hasattr(model, 'dit'):
            dit = model.dit
            batch = len(images)
            x = torch.randn(batch, dit.in_channels, *dit.input_size,
                            generator=torch.Generator().manual_seed(0)).to(device)
            t = torch.full((batch, ), timestep, device=device)
            y = torch.zeros(batch, dtype=torch.long, device=device)
            dit(x, t, y)
            return
        preprocessor = getattr(model, 'data_preprocessor', None)
        if preprocessor is not None:
            inputs = preprocessor(dict(inputs=list(images), data_samples=None), False)['inputs']
        else:
            inputs = torch.stack(list(images)).float().to(device)
        if hasattr(model, 'extract_feat'):
            model.extract_feat(inputs)
        else:
            model(inputs)


def agg_pyplot():
    """matplotlib's ``pyplot`` on the file-only Agg backend (the tools write PNGs, no display)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt
