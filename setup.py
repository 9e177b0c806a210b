import os.path as osp
import re

from setuptools import find_packages, setup

HERE = osp.dirname(osp.abspath(__file__))


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
    license='Apache License 2.0',
    zip_safe=False,
)
