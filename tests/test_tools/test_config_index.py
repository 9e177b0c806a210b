"""The ``pkg::`` look-ups memoized: the same answers as mmengine's own, and edits and installs seen."""
import os

import pytest
from mmengine.config import Config
from mmengine.config import config as config_module
from mmengine.config import utils as config_utils

import polaformerpp  # noqa: F401 (installs the memoized look-up)


def write_package(root, models):
    """A package folder with a ``.mim`` index of one metafile listing ``models`` (config paths)."""
    mim = root / '.mim'
    (mim / 'configs' / 'net').mkdir(parents=True, exist_ok=True)
    (mim / 'model-index.yml').write_text('Import:\n  - configs/net/metafile.yml\n')
    lines = ['Models:'] + [f'  - Name: m{i}\n    Config: {path}\n    Weights: w{i}.pth'
                           for i, path in enumerate(models)]
    (mim / 'configs' / 'net' / 'metafile.yml').write_text('\n'.join(lines) + '\n')
    return str(root)


def lookups(package, name):
    """(memoized, mmengine's own): each the entry, or the ValueError's text."""
    memoized = config_utils._get_cfg_metainfo
    results = []
    for look_up in (memoized, memoized.uncached):
        try:
            results.append(look_up(package, name))
        except ValueError as error:
            results.append(f'ValueError: {error}')
    return results


def test_lookups_answer_as_mmengines_and_see_edits(tmp_path):
    package = write_package(tmp_path, ['configs/net/a.py', 'configs/net/b.py', 'configs/net/a.py'])
    memoized, own = lookups(package, 'net/a.py')
    assert memoized == own == dict(Name='m0', Config='configs/net/a.py', Weights='w0.pth')
    memoized['Name'] = 'changed by a caller'  # a copy: the next look-up is not affected
    assert lookups(package, 'net/a.py')[0]['Name'] == 'm0'
    memoized, own = lookups(package, '_base_/x.py')
    assert memoized == own and memoized.startswith('ValueError: Expected configs:'), memoized

    meta = tmp_path / '.mim' / 'configs' / 'net' / 'metafile.yml'
    stat = meta.stat()
    write_package(tmp_path, ['configs/net/c.py'])
    os.utime(meta, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # even within the clock's step
    memoized, own = lookups(package, 'net/c.py')
    assert memoized == own and memoized['Config'] == 'configs/net/c.py'
    assert lookups(package, 'net/a.py')[0].startswith('ValueError')

    meta.unlink()  # a file that went missing: mmengine's own error
    with pytest.raises(FileNotFoundError):
        config_utils._get_cfg_metainfo(package, 'net/c.py')


def test_library_configs_read_as_without_the_memo(tmp_path):
    """Configs inheriting an mmdet experiment, and mmdet ``_base_/`` fragments: equal both ways."""
    pytest.importorskip('mmdet')
    bases = [['mmdet::retinanet/retinanet_r50_fpn_1x_coco.py'],
             ['mmdet::_base_/models/retinanet_r50_fpn.py', 'mmdet::_base_/datasets/coco_detection.py']]
    paths = []
    for i, base in enumerate(bases):
        paths.append(tmp_path / f'inherits_{i}.py')
        paths[-1].write_text(f'_base_ = {base!r}\n')
    memoized = [Config.fromfile(str(path)).to_dict() for path in paths]
    wrapped = config_utils._get_cfg_metainfo
    config_utils._get_cfg_metainfo = wrapped.uncached
    try:
        own = [Config.fromfile(str(path)).to_dict() for path in paths]
    finally:
        config_utils._get_cfg_metainfo = wrapped
    assert memoized == own
    assert all(cfg['model']['type'] == 'RetinaNet' for cfg in memoized)


def test_installed_packages_are_remembered_and_missing_ones_asked_again(tmp_path, monkeypatch):
    import importlib
    is_installed = config_module.is_installed
    assert is_installed('mmengine') and is_installed.uncached('mmengine')

    def no_reload(module):
        raise AssertionError(f'{module.__name__} reloaded for a package already found')

    with monkeypatch.context() as patch:  # found once: answered without mmengine's pkg_resources reload
        patch.setattr(importlib, 'reload', no_reload)
        assert is_installed('mmengine')

    name = 'polapp_installed_meanwhile'
    assert not is_installed(name)
    (tmp_path / name).mkdir()
    (tmp_path / name / '__init__.py').write_text('')
    monkeypatch.syspath_prepend(str(tmp_path))  # "installed" now: asked again, and found
    assert is_installed(name) and is_installed.uncached(name)
