"""The compiled kernels as torch custom ops: torch.compile and torch.export trace through them; without the
extension every op runs its plain torch form."""
import subprocess
import sys
import textwrap

import pytest
import torch

from polaformerpp.models.layers import PolaFormerBlock, PolaLinearAttention
from polaformerpp.ops import RopeGrid, available_backends, pola_attention
from polaformerpp.ops.fusion import fuse_modules
from polaformerpp.ops.pola_attention import as_rope_halves, eager_decompositions

needs_kernels = pytest.mark.skipif('cpu' not in available_backends(), reason='the compiled kernels are not built')
OP_NAME = 'polaformerpp.pola_attention_cpu'


def _randomised(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return module


def _compiled_graphs(module, *args):
    """Compile ``module`` with a backend that records the FX graphs dynamo hands it; run it once."""
    graphs = []

    def record(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    out = torch.compile(module, backend=record, fullgraph=True)(*args)
    return out, graphs


def _calls_op(graph_module):
    return any(OP_NAME in str(node.target) for node in graph_module.graph.nodes)


@needs_kernels
@pytest.mark.parametrize('fused', [False, True], ids=['plain', 'fused'])
def test_compiled_linear_attention_block_calls_the_kernel(fused):
    """CPU fp32 inference: the compiled block's one graph holds the custom op, and its output is eager's."""
    torch.manual_seed(0)
    block = _randomised(PolaFormerBlock(32, 2, attn_type='linear')).eval()
    if fused:
        fuse_modules(block)
    x = torch.randn(2, 6, 5, 32)
    with torch.no_grad():
        expected = block(x)
        out, graphs = _compiled_graphs(block, x)
    assert len(graphs) == 1 and _calls_op(graphs[0])
    if fused:  # each branch's output product, bias, layer scale and residual as the kernel
        assert any('polaformerpp.scaled_residual' in str(node.target) for node in graphs[0].graph.nodes)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@needs_kernels
def test_exported_attention_holds_the_kernel_and_decomposes_to_the_eager_form():
    torch.manual_seed(0)
    attn = _randomised(PolaLinearAttention(32, 2)).eval()
    x = torch.randn(1, 4, 6, 32)
    with torch.no_grad():
        expected = attn(x)
        program = torch.export.export(attn, (x, ), strict=False)
    assert any(OP_NAME in str(node.target) for node in program.graph.nodes)
    torch.testing.assert_close(program.module()(x), expected, rtol=1e-5, atol=1e-5)
    eager = program.run_decompositions(eager_decompositions())
    assert not any(OP_NAME in str(node.target) for node in eager.graph.nodes)
    torch.testing.assert_close(eager.module()(x), expected, rtol=1e-5, atol=1e-5)


@needs_kernels
@pytest.mark.parametrize('key_bias', [0.0, 40.0], ids=['shift-free', 'shifted'])
def test_compiled_training_through_the_op_matches_the_eager_backend(key_bias):
    """Under autograd the op's registered backward gives the eager backend's gradients, also for keys that
    need exponent shifts (the op's backward then runs the eager backend's autograd)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 20, 8) for _ in range(3))
    k = k + key_bias
    temps = [torch.rand(2, 16) for _ in range(2)]
    rope = RopeGrid(4, 5)
    grads = []
    for compiled in (False, True):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v, *temps)]

        def attention(*tensors, backend='torch' if not compiled else 'cpu'):
            return pola_attention(*tensors, rope=rope, backend=backend)

        fn = torch.compile(attention, backend='aot_eager', fullgraph=True) if compiled else attention
        torch._dynamo.reset()
        out = fn(*leaves)
        grads.append(torch.autograd.grad((out * v.flip(-1)).sum(), leaves))
    for name, a, b in zip(('q', 'k', 'v', 'temp_same', 'temp_opp'), *grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=name)


@needs_kernels
def test_compiled_training_step_keeps_the_kernels_and_the_gradients():
    """A fused linear block compiled for training: its graph calls the custom ops of the attention, the
    depthwise conv, the FFN's bias+GELU and the branches' scaled residuals, and the output and every
    gradient equal the eager fused block's."""
    torch.manual_seed(0)
    block = fuse_modules(_randomised(PolaFormerBlock(32, 2, attn_type='linear')))
    x = torch.randn(2, 6, 5, 32)
    results = []
    for compiled in (False, True):
        leaf = x.clone().requires_grad_(True)
        if compiled:
            out, graphs = _compiled_graphs(block, leaf)
            targets = {str(node.target) for node in graphs[0].graph.nodes}
            for op in (OP_NAME, 'polaformerpp.depthwise_conv2d', 'polaformerpp.bias_gelu',
                       'polaformerpp.scaled_residual'):
                assert any(op in t for t in targets), op
        else:
            out = block(leaf)
        grads = torch.autograd.grad((out * x.flip(-1)).sum(), [leaf, *block.parameters()])
        results.append((out, grads))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-5)
    for (name, _), a, b in zip([('x', None), *block.named_parameters()], results[1][1], results[0][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=name)


@needs_kernels
def test_the_op_registrations_pass_opcheck():
    """torch.library's own checks of the fake kernels and the autograd registrations."""
    torch.manual_seed(0)
    rope = tuple(as_rope_halves(RopeGrid(3, 4), 8))
    args = [torch.randn(1, 2, 12, 8, requires_grad=True) for _ in range(3)]
    args += [torch.rand(2, 16, requires_grad=True) for _ in range(2)]
    results = torch.library.opcheck(torch.ops.polaformerpp.pola_attention_cpu.default, (*args, *rope, 1e-6))
    assert set(results.values()) == {'SUCCESS'}, results
    image = torch.randn(2, 5, 7, 16).permute(0, 3, 1, 2).requires_grad_(True)  # channels-last memory
    conv = (image, torch.randn(16, 1, 5, 5, requires_grad=True), torch.randn(16, requires_grad=True))
    results = torch.library.opcheck(torch.ops.polaformerpp.depthwise_conv2d.default, conv)
    assert set(results.values()) == {'SUCCESS'}, results
    h, bias = torch.randn(12, 20, requires_grad=True), torch.randn(20, requires_grad=True)
    for gelu in ((h, bias), (h, None)):
        results = torch.library.opcheck(torch.ops.polaformerpp.bias_gelu.default, gelu)
        assert set(results.values()) == {'SUCCESS'}, results
    residual = [torch.randn(12, 20, requires_grad=True) for _ in range(2)]
    residual += [torch.randn(20, requires_grad=True) for _ in range(2)]
    for scales in (torch.tensor([0.0, 1.25, 1.25]), None):  # 3 samples of 4 rows; a dropped one
        results = torch.library.opcheck(torch.ops.polaformerpp.scaled_residual.default, (*residual, scales, 4))
        assert set(results.values()) == {'SUCCESS'}, results


FALLBACK_SCRIPT = textwrap.dedent('''
    import sys
    sys.modules['polaformerpp.ops._C'] = None  # as if the extension was never built
    import torch
    from polaformerpp.models import PolaFormerPP
    from polaformerpp.ops import available_backends
    from polaformerpp.ops.library import kernels_available

    assert not kernels_available() and 'cpu' not in available_backends()
    for op in ('pola_attention_cpu', 'depthwise_conv2d', 'bias_gelu', 'scaled_residual'):
        assert not hasattr(torch.ops.polaformerpp, op), op
    torch.manual_seed(0)
    arch = dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 4])
    fused, plain = PolaFormerPP(arch, drop_path_rate=0.0), PolaFormerPP(arch, drop_path_rate=0.0, fused=False)
    plain.load_state_dict(fused.state_dict())
    x = torch.randn(2, 3, 32, 32)
    for model in (fused, plain):
        model(x)[0].square().mean().backward()
    for (name, a), b in zip(fused.named_parameters(), plain.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=name)
    fused.eval(), plain.eval()
    with torch.no_grad():
        torch.testing.assert_close(fused(x)[0], plain(x)[0], rtol=1e-5, atol=1e-5)
    print('plain form ok')
''')


def test_without_the_extension_every_op_runs_its_plain_form():
    """A process in which the extension cannot load: no CPU backend, no custom op, and the fused
    backbone trains and infers exactly as the plain one."""
    result = subprocess.run([sys.executable, '-c', FALLBACK_SCRIPT], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'plain form ok' in result.stdout
