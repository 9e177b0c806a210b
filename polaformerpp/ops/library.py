"""The project's compiled kernels: one extension, ``polaformerpp.ops._C``, loaded here and nowhere else.

Its C++ is laid out by op under ``csrc/`` (``pola_attention/``, ``depthwise/``,
``linear_epilogues/``, shared headers in ``include/``) and built by
``python setup.py build_ext --inplace`` (``tools/setup_env.sh`` does). Where it
is not built (no C++ compiler), :data:`kernels` is None and every op runs its
plain torch form: :func:`cpu_kernels_apply` is then always False.
"""
from typing import Optional

import torch
from torch import Tensor

from .tracing import is_tracing

try:  # the private compiled extension
    from . import _C as kernels
except ImportError:
    kernels = None

__all__ = ['kernels', 'kernels_available', 'cpu_kernels_apply', 'custom_ops_apply']


def kernels_available() -> bool:
    """Whether the compiled kernels were built with this installation."""
    return kernels is not None


def cpu_kernels_apply(*tensors: Optional[Tensor]) -> bool:
    """Whether the compiled kernels may compute on ``tensors`` (None entries skipped): kernels built,
    fp32 CPU tensors, not traced or compiled, no CPU autocast (the conditions every fused CPU form shares)."""
    if kernels is None or is_tracing() or torch.is_autocast_enabled('cpu'):
        return False
    return all(t.device.type == 'cpu' and t.dtype == torch.float32 for t in tensors if t is not None)


def custom_ops_apply(*tensors: Optional[Tensor]) -> bool:
    """Whether the kernels may compute on ``tensors`` (None entries skipped) as torch custom ops: under
    torch.compile or torch.export (not ``torch.jit.trace``), kernels built, fp32 CPU tensors, no CPU autocast."""
    if kernels is None or not torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    if torch.is_autocast_enabled('cpu'):
        return False
    return all(t.device.type == 'cpu' and t.dtype == torch.float32 for t in tensors if t is not None)
