import os.path as osp
import re
from setuptools import find_packages, setup

HERE = osp.dirname(osp.abspath(__file__))


def cpu_extensions():
    """The fused CPU feature-map kernels (``polaformerpp.ops.pola_attention._pola_features_cpu``).

    Optional: without a C++ compiler the package installs and the attention
    falls back to its eager torch implementation.
    """
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        return [], {}
    version = tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2])
    std = '-std=c++20' if version >= (2, 14) else '-std=c++17'  # torch 2.14 headers need C++20
    ext = CppExtension(
        'polaformerpp.ops.pola_attention._pola_features_cpu',
        ['polaformerpp/ops/pola_attention/csrc/pola_features_cpu.cpp'],
        # no -ffast-math: only the two flags that let the loops' selects vectorise
        extra_compile_args=['-O3', '-fno-trapping-math', '-fno-math-errno', '-fopenmp', std],
        extra_link_args=['-fopenmp'],
        optional=True)
    return [ext], {'build_ext': BuildExtension}


def read_version():
    with open(osp.join(HERE, 'polaformerpp', 'version.py')) as f:
        return re.search(r"__version__ = '([^']+)'", f.read()).group(1)


def read_requirements(name):
    """Requirement lines of ``requirements/<name>.txt`` without comments."""
    reqs = []
    with open(osp.join(HERE, 'requirements', f'{name}.txt')) as f:
        for line in f:
            line = line.split('#', 1)[0].strip()
            if line and not line.startswith('-'):
                reqs.append(line)
    return reqs


ext_modules, cmdclass = cpu_extensions()

setup(
    name='polaformerpp',
    version=read_version(),
    description='PolaFormer++: polarity-aware linear attention with channel-wise '
    'spikiness, for OpenMMLab classification, detection, segmentation, '
    'super-resolution and generation',
    long_description=open(osp.join(HERE, 'README.md')).read() if osp.exists(osp.join(HERE, 'README.md')) else '',
    long_description_content_type='text/markdown',
    packages=find_packages(include=['polaformerpp', 'polaformerpp.*']),
    python_requires='>=3.9',
    install_requires=read_requirements('runtime'),
    extras_require={
        'tests': read_requirements('tests'),
        'optional': read_requirements('optional'),
    },
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    license='Apache License 2.0',
    zip_safe=False,
)
