"""torch.compile in the tools: whether this installation can compile, and the config's ``compile`` key.

mmengine 0.10.7's Runner reads ``cfg.compile`` (``True`` or a dict of
``torch.compile`` options) at the start of ``train()`` and replaces the
model's ``train_step`` with ``torch.compile(train_step, **options)``: the data
preprocessor, forward, loss and the optimizer wrapper's update are traced (the
backward runs through the compiled graphs' autograd); validation stays eager.
``tools/train.py --compile`` sets that key, ``tools/test.py --compile``
compiles ``test_step`` the same way. Both first ask
:func:`compile_unavailable_reason`, so an installation that cannot compile
fails at once with the reason, not after building the data pipeline or in
the middle of the first iteration.
"""
import shutil
from typing import Optional, Union

import torch

__all__ = ['CompileUnavailableError', 'compile_unavailable_reason', 'check_compile_support', 'compile_options',
           'compile_method']


class CompileUnavailableError(RuntimeError):
    """torch.compile cannot run here (old torch, unsupported Python, no compiler toolchain)."""


def compile_unavailable_reason(device_type: str = 'cpu', backend: str = 'inductor') -> Optional[str]:
    """Why ``torch.compile(..., backend=backend)`` cannot run for ``device_type`` here, or ``None``.

    Checked: ``torch.compile`` exists (torch >= 2.0); TorchDynamo supports this
    Python; for inductor, a C++ compiler on CPU and Triton on CUDA.
    """
    if not hasattr(torch, 'compile'):
        return f'torch {torch.__version__} has no torch.compile (it needs torch >= 2.0)'
    try:
        from torch._dynamo.eval_frame import check_if_dynamo_supported
        check_if_dynamo_supported()
    except ImportError:
        pass
    except RuntimeError as error:
        return f'torch {torch.__version__}: {error}'
    if backend != 'inductor':
        return None
    if device_type == 'cuda':
        try:
            import triton  # noqa: F401
        except ImportError:
            return 'the inductor backend needs Triton on CUDA (pip install triton)'
        return None
    try:
        from torch._inductor import config as inductor_config
        from torch._inductor.cpp_builder import get_cpp_compiler
        get_cpp_compiler()
    except ImportError:
        return f'torch {torch.__version__} has no inductor backend'
    except Exception as error:  # the compiler search raises when none is found
        wanted = getattr(getattr(inductor_config, 'cpp', None), 'cxx', None)
        return (f'the inductor backend compiles C++ for the CPU and found no compiler ({error}); install g++ or '
                f'clang++, or set CXX (looked for {wanted!r})')
    if shutil.which('g++') is None and shutil.which('clang++') is None and shutil.which('c++') is None:
        # get_cpp_compiler may return a name it did not find on PATH
        return 'the inductor backend compiles C++ for the CPU: no g++, clang++ or c++ on PATH'
    return None


def compile_options(value: Union[bool, dict, None]) -> Optional[dict]:
    """The ``torch.compile`` options of a config's ``compile`` key (``None``: off; ``True``: defaults)."""
    if value is None or value is False:
        return None
    if value is True:
        return {}
    if isinstance(value, dict):
        return dict(value)
    raise TypeError(f'compile must be True/False or a dict of torch.compile options, got {value!r}')


def check_compile_support(options: Optional[dict], device_type: str = 'cpu', option: str = '--compile') -> None:
    """Raise :class:`CompileUnavailableError` naming ``option`` when ``options`` asks for a compile that cannot run."""
    if options is None:
        return
    reason = compile_unavailable_reason(device_type, options.get('backend', 'inductor'))
    if reason is not None:
        raise CompileUnavailableError(f'{option}: torch.compile cannot run here: {reason}. Run without it '
                                      f'(drop --compile, or set compile=False in the config).')


def compile_method(model: torch.nn.Module, name: str, options: dict) -> None:
    """Replace ``model.<name>`` (e.g. ``test_step``) by its ``torch.compile``-d version, as mmengine's Runner does."""
    setattr(model, name, torch.compile(getattr(model, name), **options))
