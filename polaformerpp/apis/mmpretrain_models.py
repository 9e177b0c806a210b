"""The ImageNet classifiers in mmpretrain's model hub, by name.

``import polaformerpp`` calls :func:`register_on_mmpretrain_import`: the models
of ``configs/classification/metafile.yml`` enter mmpretrain's ``ModelHub``
through ``ModelHub.register_model_index`` (the call mmpretrain makes for its own
model index) as soon as the hub exists -- at once if mmpretrain is imported
already, else right after ``mmpretrain.apis.model`` is imported, so importing
polaformerpp does not import mmpretrain. Then mmpretrain's own API takes the
names::

    import polaformerpp
    import mmpretrain
    mmpretrain.list_models('polapp*')
    model = mmpretrain.get_model('polapp-b2_8xb256_in1k', pretrained='polapp-b2_in1k.pth')
    inferencer = mmpretrain.ImageClassificationInferencer('polapp-b2_8xb256_in1k', pretrained='polapp-b2_in1k.pth')
    mmpretrain.inference_model('polapp-b2_8xb256_in1k', 'demo.jpg', pretrained='polapp-b2_in1k.pth')

The metafile lists no download links (``Weights: null``): ``pretrained`` takes a
local checkpoint (the authors' converted with
``tools/model_converters/polapp_official2mm.py``, or one of your own runs).
"""
import os.path as osp
import warnings
from typing import List, Optional, Tuple

__all__ = ['register_mmpretrain_models', 'register_on_mmpretrain_import', 'classification_metafile']

#: the module that defines mmpretrain's ``ModelHub``
HUB_MODULE = 'mmpretrain.apis.model'
#: the metafile, relative to the folder that holds ``configs/``
METAFILE = osp.join('configs', 'classification', 'metafile.yml')
#: the checkout's root: configs/ lies beside the package when it is used from a checkout
_REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def classification_metafile() -> Tuple[str, str]:
    """``(metafile, config_prefix)`` of the installed package's classifiers.

    The package's ``.mim`` folder (what ``pip install`` / ``pip install -e`` creates,
    holding ``configs/``), else the checkout the package is imported from.

    Raises:
        FileNotFoundError: neither holds ``configs/classification/metafile.yml``.
    """
    from ..utils.config_scope import package_dir
    candidates = (osp.join(package_dir(), '.mim'), _REPO_ROOT)
    for root in candidates:
        if osp.isfile(osp.join(root, METAFILE)):
            return osp.join(root, METAFILE), root
    raise FileNotFoundError(f'{METAFILE} not found under {" or ".join(candidates)}: reinstall the package '
                            f'(`pip install -e .` in a checkout), which creates polaformerpp/.mim')


def register_mmpretrain_models(metafile: Optional[str] = None, config_prefix: Optional[str] = None) -> List[str]:
    """Register the classifiers of a metafile (default: this package's) in mmpretrain's ``ModelHub``.

    ``import polaformerpp`` already does this for the package's own metafile
    (:func:`register_on_mmpretrain_import`); call it for another metafile.

    Args:
        metafile: the metafile to read; default :func:`classification_metafile`.
        config_prefix: what its ``Config`` paths are relative to; default the folder
            holding ``configs/`` for the default metafile, else the metafile's folder.

    Returns:
        list[str]: the names registered now (a metafile registered before is skipped,
        so calling it twice is harmless).

    Raises:
        FileNotFoundError: the metafile, or a config it names, does not exist.
        ValueError: some of its models are registered and some are not (a name clash).
    """
    from mmpretrain.apis.model import ModelHub
    from modelindex.load_model_index import load

    if metafile is None:
        metafile, default_prefix = classification_metafile()
        config_prefix = config_prefix or default_prefix
    if not osp.isfile(metafile):
        raise FileNotFoundError(f'metafile {metafile!r} not found')
    config_prefix = config_prefix or osp.dirname(metafile)
    index = load(metafile)
    index.build_models_with_collections()
    names = [model.name.lower() for model in index.models]
    for model in index.models:
        config = model.config if model.config is None or osp.isabs(model.config) else \
            osp.join(config_prefix, model.config)
        if config is None or not osp.isfile(config):
            raise FileNotFoundError(f'{metafile}: model {model.name} names config {model.config!r}, '
                                    f'not found under {config_prefix!r}')
    new = [name for name in names if not ModelHub.has(name)]
    if not new:
        return []
    if len(new) != len(names):
        raise ValueError(f'some models of {metafile} are registered already and some not '
                         f'({sorted(set(names) - set(new))} are): register the metafile once')
    ModelHub.register_model_index(metafile, config_prefix=config_prefix)
    return new


def _register_quietly(_module=None) -> None:
    """:func:`register_mmpretrain_models`, turning a failure into a warning (it runs inside
    mmpretrain's import, which it must not break)."""
    try:
        register_mmpretrain_models()
    except Exception as err:  # noqa: BLE001 (any failure becomes the warning)
        warnings.warn(f'polaformerpp: its ImageNet classifiers were not added to mmpretrain\'s model hub '
                      f'({type(err).__name__}: {err}); mmpretrain.get_model(<polapp name>) will not find them',
                      RuntimeWarning, stacklevel=2)


def register_on_mmpretrain_import() -> None:
    """Register the package's classifiers in mmpretrain's hub now, or when mmpretrain is imported."""
    from ..utils.import_hooks import call_after_import
    call_after_import(HUB_MODULE, _register_quietly)
