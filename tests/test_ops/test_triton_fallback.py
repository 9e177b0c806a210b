"""``backend='auto'`` falls back to the torch backend where a Triton kernel fails to build or launch.

The failure is simulated (a kernel that raises Triton's out-of-resources
error); the other kernels run interpreted on CPU tensors (``TRITON_INTERPRET=1``,
set by conftest.py where there is no GPU) or on a CUDA device.
"""
import warnings

import pytest
import torch

pytest.importorskip('triton')

from triton.runtime.errors import OutOfResources  # noqa: E402

from polaformerpp.ops import RopeGrid, pola_attention  # noqa: E402
from polaformerpp.ops.pola_attention import dispatch, triton_kernels, triton_ops  # noqa: E402
from polaformerpp.ops.pola_attention.triton_ops import TritonKernelError  # noqa: E402


@pytest.fixture
def device(monkeypatch):
    """Where the kernels run here; 'auto' is made to consider them for CPU tensors under the interpreter."""
    monkeypatch.setattr(triton_ops, '_FAILURES', {})  # no failure remembered from other tests
    if triton_kernels.INTERPRET:
        monkeypatch.setattr(dispatch, '_on_triton_device', lambda q: True)
        return 'cpu'
    if torch.cuda.is_available():
        return 'cuda'
    pytest.skip('the Triton kernels run neither interpreted (TRITON_INTERPRET=1 before triton is imported) '
                'nor on a CUDA device in this process')


class FailingKernel:
    """Stands in for ``kernel``: every launch raises what a GPU without enough shared memory raises."""

    def __init__(self, kernel):
        self.base_fn = kernel.base_fn  # the Python function under the autotuner (its name)
        self.launches = 0

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches += 1
            raise OutOfResources(232448, 101376, 'shared memory')
        return launch


def make_inputs(device, requires_grad=False):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 16, generator=gen).to(device) for _ in range(3))
    temps = [torch.rand(2, 32, generator=gen).to(device) for _ in range(2)]
    inputs = [q, k, v, *temps]
    return [t.requires_grad_(requires_grad) for t in inputs]


def test_auto_falls_back_once_with_one_warning(device, monkeypatch):
    failing = FailingKernel(triton_ops.fwd_out_kernel)
    monkeypatch.setattr(triton_ops, 'fwd_out_kernel', failing)
    inputs = make_inputs(device)
    expected = pola_attention(*inputs, rope=RopeGrid(2, 3), backend='torch')
    with pytest.warns(RuntimeWarning, match=r"Triton kernels failed.*fwd_out_kernel.*OutOfResources.*shared memory"):
        out = pola_attention(*inputs, rope=RopeGrid(2, 3), backend='auto')
    torch.testing.assert_close(out, expected)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        again = pola_attention(*inputs, rope=RopeGrid(2, 3), backend='auto')
    torch.testing.assert_close(again, expected)
    assert failing.launches == 1  # the kernels are not tried again for inputs of this kind


def test_triton_backend_raises(device, monkeypatch):
    monkeypatch.setattr(triton_ops, 'fwd_state_kernel', FailingKernel(triton_ops.fwd_state_kernel))
    with pytest.raises(TritonKernelError, match=r'fwd_state_kernel failed to build or launch: OutOfResources') as info:
        pola_attention(*make_inputs(device), backend='triton')
    assert isinstance(info.value.__cause__, OutOfResources) and isinstance(info.value, RuntimeError)
    assert not triton_ops._FAILURES  # nothing remembered: 'triton' does not fall back


def test_auto_backward_falls_back(device, monkeypatch):
    """The forward kernels ran; the backward's fail: the gradients come from the torch backend."""
    monkeypatch.setattr(triton_ops, 'bwd_query_kernel', FailingKernel(triton_ops.bwd_query_kernel))
    grads = {}
    for backend in ('torch', 'auto'):
        inputs = make_inputs(device, requires_grad=True)
        out = pola_attention(*inputs, rope=RopeGrid(2, 3), backend=backend)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            out.square().sum().backward()
        grads[backend] = [t.grad for t in inputs]
        assert len(caught) == (backend == 'auto'), [str(w.message) for w in caught]
    assert 'bwd_query_kernel' in str(caught[0].message)
    for a, e in zip(grads['auto'], grads['torch']):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-6)

    inputs = make_inputs(device, requires_grad=True)
    out = pola_attention(*inputs, rope=RopeGrid(2, 3), backend='triton')
    with pytest.raises(TritonKernelError, match='bwd_query_kernel'):
        out.sum().backward()
