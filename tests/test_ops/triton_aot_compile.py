"""Ahead-of-time build of every Triton kernel of the op for a CUDA target; no GPU needed (ptxas is).

The interpreter the other Triton tests run under does not check what a GPU
build checks (dot shapes, layouts, types). Run as a script (without
``TRITON_INTERPRET=1``)::

    python tests/test_ops/triton_aot_compile.py

exits 0 after compiling the kernels for sm_90 and sm_80 (the exponent-shifted
variants too), 3 when Triton has no ptxas to build with.
"""
import sys


def compile_kernels_for_target(head_dim: int, dtype: str = 'bf16', has_rope: bool = True,
                               capability: int = 90, block_n: int = 32, num_warps: int = 4,
                               num_stages: int = 1, rope_grid: bool = False, shifted: bool = False,
                               kernels=None) -> dict:
    """Compile every kernel of :mod:`polaformerpp.ops.pola_attention.triton_kernels` for one target.

    Args:
        head_dim: ``d``. dtype: ``'fp32'``, ``'fp16'`` or ``'bf16'`` (of q/k/v/o).
        capability: e.g. 90 for sm_90 (H100/H200), 80 for A100.
        rope_grid: RoPE from row/column tables (``RopeGrid``) instead of ``(N, 2d)`` tables.
        shifted: the exponent-shifted variants (inputs beyond the shift-free range).
        kernels: names of the kernels to build (default: all).

    Returns:
        dict: kernel name -> ``triton.compiler.CompiledKernel`` (``.asm['ptx']``, ...).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from polaformerpp.ops.pola_attention.triton_kernels import INTERPRET, IO_POINTERS, KERNELS, block_d
    if INTERPRET:
        raise RuntimeError('compile_kernels_for_target does not work with TRITON_INTERPRET=1')

    precision = 'tf32x3' if dtype == 'fp32' else 'tf32'
    constants = dict(HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim), HAS_ROPE=has_rope,
                     ROPE_GRID=has_rope and rope_grid, SHIFTED=shifted, PRECISION=precision, BLOCK_N=block_n)
    compiled = {}
    for name, kernel in KERNELS.items():
        if kernels is not None and name not in kernels:
            continue
        fn = kernel.fn  # the JITFunction under the autotuner
        signature = {}
        for arg in fn.arg_names:
            if arg in constants:
                signature[arg] = 'constexpr'
            elif arg.endswith('_ptr'):
                signature[arg] = '*' + (dtype if arg in IO_POINTERS else 'fp32')
            else:
                signature[arg] = 'fp32' if arg == 'eps' else 'i32'
        compiled[name] = triton.compile(
            ASTSource(fn, signature, constants), target=GPUTarget('cuda', capability, 32),
            options=dict(num_warps=num_warps, num_stages=num_stages))
    return compiled


def main() -> int:
    try:
        from triton import knobs
        knobs.nvidia.ptxas.path
    except Exception as exc:
        print('no ptxas:', exc)
        return 3
    for head_dim, dtype, has_rope, capability, grid, shifted in [(12, 'bf16', True, 90, False, True),
                                                                (16, 'fp32', False, 80, False, False),
                                                                (64, 'bf16', True, 90, True, False)]:
        kernels = compile_kernels_for_target(head_dim, dtype, has_rope, capability, rope_grid=grid,
                                             shifted=shifted)
        assert all('ptx' in k.asm for k in kernels.values())
    print('ok')
    return 0


if __name__ == '__main__':
    sys.exit(main())
