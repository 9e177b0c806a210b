import os
import os.path as osp
import re
import shutil
from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = osp.dirname(osp.abspath(__file__))


def cpu_extensions():
    """The project's one compiled extension, ``polaformerpp.ops._C``: every op's CPU kernels.

    Laid out by op under ``polaformerpp/ops/csrc/`` (``pola_attention/``,
    ``depthwise/``, ``linear_epilogues/``; shared headers in ``include/``);
    ``polaformerpp/ops/library.py`` loads it. Optional: without a C++ compiler
    the package installs and every op runs its plain torch form.
    """
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        return [], {}
    version = tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2])
    std = '-std=c++20' if version >= (2, 14) else '-std=c++17'  # torch 2.14 headers need C++20
    csrc = osp.join('polaformerpp', 'ops', 'csrc')
    sources = [osp.join(csrc, 'extension.cpp')] + sorted(
        osp.join(csrc, op, name) for op in ('pola_attention', 'depthwise', 'linear_epilogues')
        for name in os.listdir(osp.join(HERE, csrc, op)) if name.endswith('.cpp'))
    ext = CppExtension(
        'polaformerpp.ops._C',
        sources,
        include_dirs=[osp.join(HERE, csrc, 'include')],
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


# What ``_base_ = ['polaformerpp::<task>/<config>.py']`` resolves against:
# mmengine reads <package>/.mim/model-index.yml and <package>/.mim/configs/<path>
# (polaformerpp/utils/config_scope.py registers the scope when the package is imported).
MIM_ITEMS = ('configs', 'model-index.yml')
MIM_DIR = osp.join('polaformerpp', '.mim')


def _remove(path):
    if osp.islink(path) or osp.isfile(path):
        os.remove(path)
    elif osp.isdir(path):
        shutil.rmtree(path)


def _copy(src, dst):
    _remove(dst)
    if osp.isdir(src):
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
    else:
        shutil.copyfile(src, dst)


def link_mim_items():
    """Point ``polaformerpp/.mim/<item>`` at the checkout's ``<item>`` (relative symlinks).

    Runs on every setup.py invocation from a tree that has ``configs/`` (a clone,
    or an unpacked sdist), so an editable install -- legacy ``develop`` or PEP 660,
    both of which import the package from this tree -- finds the configs, and
    they stay the ones being edited. Where symlinks are not allowed (Windows
    without the privilege) the items are copied instead. The folder is generated
    (ignored by git, pruned from the sdist).
    """
    mim_dir = osp.join(HERE, MIM_DIR)
    for item in MIM_ITEMS:
        src = osp.join(HERE, item)
        if not osp.exists(src):
            continue
        os.makedirs(mim_dir, exist_ok=True)
        dst = osp.join(mim_dir, item)
        rel = osp.relpath(src, mim_dir)
        if osp.islink(dst) and os.readlink(dst) == rel:
            continue
        _remove(dst)
        try:
            os.symlink(rel, dst, target_is_directory=osp.isdir(src))
        except OSError:
            _copy(src, dst)


class BuildPyWithConfigs(build_py):
    """``build_py`` that also puts copies of the configs in ``<build_lib>/polaformerpp/.mim``.

    That is what a wheel (from the checkout or from the sdist, which carries
    ``configs/``) installs. Editable builds skip it: they use the tree's links.
    """

    def _mim_pairs(self):
        pairs = []
        for item in MIM_ITEMS:
            src = osp.join(HERE, item)
            if osp.exists(src):
                pairs.append((src, osp.join(self.build_lib, MIM_DIR, item)))
        return pairs

    def run(self):
        super().run()
        if getattr(self, 'editable_mode', False):
            return
        for src, dst in self._mim_pairs():
            os.makedirs(osp.dirname(dst), exist_ok=True)
            _copy(src, dst)

    def get_outputs(self, include_bytecode=1):
        outputs = super().get_outputs(include_bytecode)
        if getattr(self, 'editable_mode', False):
            return outputs
        for src, dst in self._mim_pairs():
            if osp.isdir(src):
                for root, dirs, files in os.walk(src):
                    dirs[:] = [d for d in dirs if d != '__pycache__']
                    rel_root = osp.relpath(root, src)
                    outputs.extend(
                        osp.normpath(osp.join(dst, rel_root, f)) for f in files if not f.endswith('.pyc'))
            else:
                outputs.append(dst)
        return outputs


link_mim_items()
ext_modules, cmdclass = cpu_extensions()
cmdclass = dict(cmdclass, build_py=BuildPyWithConfigs)

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
