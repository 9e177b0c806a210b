"""The ImageNet classifiers in mmpretrain's model hub, by name."""
import os.path as osp
from typing import List, Optional

__all__ = ['register_mmpretrain_models']

#: the checkout's root: configs/ lies beside the package (editable install)
_REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def register_mmpretrain_models(metafile: Optional[str] = None, config_prefix: Optional[str] = None) -> List[str]:
    """Register the classifiers of ``configs/classification/metafile.yml`` with mmpretrain.

    mmpretrain's ``inference_model`` picks its inferencer from the model hub's
    task entry, so it accepts a model name but not a model built from a config
    path (true of mmpretrain's own configs too). After this call the names
    work everywhere mmpretrain takes one::

        register_mmpretrain_models()
        mmpretrain.list_models('polapp*')
        mmpretrain.inference_model('polapp-b0_8xb256_in1k', img, pretrained='polapp-b0_in1k.pth')
        model = mmpretrain.get_model('polapp-b0_8xb256_in1k', pretrained='polapp-b0_in1k.pth')
        mmpretrain.inference_model(model, img)

    A model built from a config path runs through the inferencer directly:
    ``ImageClassificationInferencer(model)`` or ``ImageClassificationInferencer(config_path)``.

    Args:
        metafile: the metafile to read; default ``configs/classification/metafile.yml``
            of this checkout.
        config_prefix: what its ``Config`` paths are relative to; default the checkout's root.

    Returns:
        list[str]: the names registered now (models already registered are skipped,
        so calling it twice is harmless).
    """
    from mmpretrain.apis import ModelHub
    from modelindex.load_model_index import load

    metafile = metafile or osp.join(_REPO_ROOT, 'configs', 'classification', 'metafile.yml')
    if not osp.isfile(metafile):
        raise FileNotFoundError(f'metafile {metafile!r} not found: pass metafile= (and config_prefix=) '
                                f'pointing at configs/classification/metafile.yml of a checkout')
    config_prefix = config_prefix or (_REPO_ROOT if metafile.startswith(_REPO_ROOT) else osp.dirname(metafile))
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
