"""Whether code runs under a tracer, where the ops keep their plain torch forms."""
import torch

__all__ = ['is_tracing']


def is_tracing() -> bool:
    """Under torch.compile or torch.jit.trace (no data-dependent checks, no opaque kernels)."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()
