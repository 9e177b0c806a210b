"""The project's compiled kernels: one extension, ``polaformerpp.ops._C``, loaded here and nowhere else.

Its C++ is laid out by op under ``csrc/`` (``pola_attention/``, ``depthwise/``,
``linear_epilogues/``, shared headers in ``include/``) and built by
``python setup.py build_ext --inplace`` (``tools/setup_env.sh`` does). Where it
is not built (no C++ compiler), :data:`kernels` is None and every op runs its
plain torch form: :func:`cpu_kernels_apply` is then always False.
"""
from typing import Callable, Optional

import torch
from torch import Tensor

from .tracing import is_tracing

try:  # the private compiled extension
    from . import _C as kernels
except ImportError:
    kernels = None

__all__ = ['kernels', 'kernels_available', 'cpu_kernels_apply', 'custom_ops_apply', 'register_kernel_op']


def kernels_available() -> bool:
    """Whether the compiled kernels were built with this installation."""
    return kernels is not None


def cpu_kernels_apply(*tensors: Optional[Tensor]) -> bool:
    """Whether the compiled kernels may compute on ``tensors`` (None entries skipped): kernels built,
    fp32 CPU tensors, not traced or compiled, no CPU autocast (the conditions every fused CPU form shares)."""
    if kernels is None or is_tracing():
        return False
    return _fp32_cpu_without_autocast(tensors)


def custom_ops_apply(*tensors: Optional[Tensor]) -> bool:
    """Whether the kernels may compute on ``tensors`` (None entries skipped) as torch custom ops: under
    torch.compile or torch.export (not ``torch.jit.trace``), kernels built, fp32 CPU tensors, no CPU autocast."""
    if kernels is None or not torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    return _fp32_cpu_without_autocast(tensors)


def _fp32_cpu_without_autocast(tensors) -> bool:
    """fp32 CPU tensors (None entries skipped), CPU autocast off: what the kernels compute on, either way."""
    if torch.is_autocast_enabled('cpu'):
        return False
    return all(t.device.type == 'cpu' and t.dtype == torch.float32 for t in tensors if t is not None)


def register_kernel_op(name: str, forward: Callable, forward_fake: Callable, backward: Callable,
                       backward_fake: Callable, autograd_backward: Callable, setup_context: Callable) -> None:
    """Register a kernel as the torch custom op ``polaformerpp::<name>`` and its backward as
    ``polaformerpp::<name>_backward``, each with its fake (meta) kernel, the first differentiated
    by ``autograd_backward`` (which calls the second) with ``setup_context``.

    The ops' schemas come from the functions' type annotations (``torch.library.custom_op``);
    neither mutates its arguments.
    """
    forward_op = torch.library.custom_op(f'polaformerpp::{name}', forward, mutates_args=())
    forward_op.register_fake(forward_fake)
    backward_op = torch.library.custom_op(f'polaformerpp::{name}_backward', backward, mutates_args=())
    backward_op.register_fake(backward_fake)
    forward_op.register_autograd(autograd_backward, setup_context=setup_context)
