"""The fused CPU backend as torch custom ops, so that ``torch.compile`` and ``torch.export`` trace through it.

A compiled kernel called through pybind is opaque to dynamo; registered with
``torch.library`` (a fake kernel giving the output shape, an autograd
formula), it is one node of the traced graph instead:

* ``torch.ops.polaformerpp.pola_attention_cpu(q, k, v, temp_same, temp_opp,
  sin_lo, cos_lo, sin_hi, cos_hi, grid_width, eps) -> out``:
  :func:`~.cpu.pola_attention_cpu` (the RoPE as the four tables of a
  :class:`~polaformerpp.ops.rope.RopeHalves` and its grid width, or four Nones);
* ``torch.ops.polaformerpp.pola_attention_cpu_backward(grad, q, k, v,
  temp_same, temp_opp, out, sin_lo, cos_lo, sin_hi, cos_hi, grid_width, eps)
  -> (dq, dk, dv, dtemp_same, dtemp_opp)``: the key pass again for the state,
  then the analytic backward (:func:`~.cpu_backward.pola_attention_cpu_backward`);
  for inputs that need exponent shifts, the eager backend's autograd.

Both decide at run time, inside the op, whether the inputs need exponent
shifts (a data-dependent test a traced graph cannot hold). The dispatcher
calls them under ``torch.compile`` / ``torch.export``
(:func:`pola_attention_cpu_traceable`); in eager mode it calls the kernels
directly. :func:`eager_decompositions` maps the op to the eager backend, for
exporters to formats without it (ONNX). Registered only when the compiled
kernels are built.
"""
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import Tensor

from ..library import kernels_available, register_kernel_op
from ..linear_residual import eager_decompositions as linear_residual_decompositions
from ..rope import RopeHalves
from .cpu import exponent_shift_needed, pola_attention_cpu, pola_attention_cpu_with_state
from .cpu_backward import pola_attention_cpu_backward
from .eager import pola_attention_torch

__all__ = ['pola_attention_cpu_traceable', 'eager_decompositions', 'OPS_REGISTERED']

#: whether ``torch.ops.polaformerpp.pola_attention_cpu`` (and its backward) exist in this process
OPS_REGISTERED = kernels_available()


def _rope(sin_lo, cos_lo, sin_hi, cos_hi, grid_width) -> Optional[RopeHalves]:
    return None if sin_lo is None else RopeHalves(sin_lo, cos_lo, sin_hi, cos_hi, grid_width)


def _forward(q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor, sin_lo: Optional[Tensor],
             cos_lo: Optional[Tensor], sin_hi: Optional[Tensor], cos_hi: Optional[Tensor], grid_width: int,
             eps: float) -> Tensor:
    return pola_attention_cpu(q, k, v, temp_same, temp_opp, _rope(sin_lo, cos_lo, sin_hi, cos_hi, grid_width), eps)


def _forward_fake(q, k, v, temp_same, temp_opp, sin_lo, cos_lo, sin_hi, cos_hi, grid_width, eps):
    return q.new_empty(*q.shape[:3], v.shape[-1])


def _eager(q, k, v, temp_same, temp_opp, sin_lo, cos_lo, sin_hi, cos_hi, grid_width, eps):
    return pola_attention_torch(q, k, v, temp_same, temp_opp, _rope(sin_lo, cos_lo, sin_hi, cos_hi, grid_width), eps)


def _backward_op(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor, out: Tensor,
                 sin_lo: Optional[Tensor], cos_lo: Optional[Tensor], sin_hi: Optional[Tensor],
                 cos_hi: Optional[Tensor], grid_width: int,
                 eps: float) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    rope = _rope(sin_lo, cos_lo, sin_hi, cos_hi, grid_width)
    if exponent_shift_needed(q, k, temp_same, temp_opp):  # the eager backend's autograd follows the shifts
        # (torch.func: a custom op's kernel runs below the autograd dispatch key, which torch.func re-enters)
        _, vjp = torch.func.vjp(lambda *inputs: pola_attention_torch(*inputs, rope, eps), q, k, v, temp_same,
                                temp_opp)
        return tuple(g.contiguous() for g in vjp(grad))
    _, state, key_mean, _ = pola_attention_cpu_with_state(q, k, v, temp_same, temp_opp, rope, eps, shifted=False)
    return pola_attention_cpu_backward(grad, q, k, v, temp_same, temp_opp, out, state, key_mean, rope, eps)


def _backward_fake(grad, q, k, v, temp_same, temp_opp, out, sin_lo, cos_lo, sin_hi, cos_hi, grid_width, eps):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v, temp_same, temp_opp))


def _setup_context(ctx, inputs, output):
    q, k, v, temp_same, temp_opp, sin_lo, cos_lo, sin_hi, cos_hi, grid_width, eps = inputs
    ctx.save_for_backward(q, k, v, temp_same, temp_opp, output, sin_lo, cos_lo, sin_hi, cos_hi)
    ctx.grid_width, ctx.eps = grid_width, eps


def _backward(ctx, grad_out):
    q, k, v, temp_same, temp_opp, out, *tables = ctx.saved_tensors
    grads = torch.ops.polaformerpp.pola_attention_cpu_backward(grad_out.contiguous(), q, k, v, temp_same, temp_opp,
                                                               out, *tables, ctx.grid_width, ctx.eps)
    return (*grads, None, None, None, None, None, None)


if OPS_REGISTERED:
    register_kernel_op('pola_attention_cpu', _forward, _forward_fake, _backward_op, _backward_fake, _backward,
                       _setup_context)


def pola_attention_cpu_traceable(q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor,
                                 rope: Optional[RopeHalves] = None, eps: float = 1e-6) -> Tensor:
    """The fused CPU backend as one custom op (forward and backward): what ``torch.compile`` and
    ``torch.export`` see of ``backend='cpu'``. Arguments as :func:`~.cpu.pola_attention_cpu`."""
    tables = (None, None, None, None, 0) if rope is None else tuple(rope)
    return torch.ops.polaformerpp.pola_attention_cpu(q, k, v, temp_same, temp_opp, *tables, float(eps))


def eager_decompositions() -> Dict[object, Callable]:
    """``{custom op: its eager torch form}`` (the attention's and the scaled residual's), for
    ``ExportedProgram.run_decompositions`` where the target format has no such operator (ONNX); empty
    where the ops are not registered."""
    if not OPS_REGISTERED:
        return {}
    return {torch.ops.polaformerpp.pola_attention_cpu.default: _eager, **linear_residual_decompositions()}
