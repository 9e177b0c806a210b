"""Capture and restore the random number generators a training process uses.

The state is made of plain Python values and CPU tensors only, so a checkpoint
that carries it still loads with ``torch.load(..., weights_only=True)``:

* ``python``: ``random.getstate()`` (a tuple of ints),
* ``numpy``: the legacy global ``MT19937`` generator, its 624 keys as an int64 tensor,
* ``torch``: ``torch.get_rng_state()`` (a uint8 tensor),
* ``cuda``: ``torch.cuda.get_rng_state_all()`` (one uint8 tensor per device, empty without CUDA).
"""
import contextlib
import random
from typing import Dict, Iterator

import numpy as np
import torch


def capture_rng_state() -> Dict:
    """The current states of python ``random``, numpy's global generator, torch CPU and CUDA."""
    name, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    cuda = []
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = [s.clone() for s in torch.cuda.get_rng_state_all()]
    return dict(
        python=random.getstate(),
        numpy=dict(name=str(name), keys=torch.from_numpy(np.asarray(keys, dtype=np.int64)),
                   pos=int(pos), has_gauss=int(has_gauss), gauss=float(gauss)),
        torch=torch.get_rng_state().clone(),
        cuda=cuda)


def restore_rng_state(state: Dict) -> None:
    """Put back a state returned by :func:`capture_rng_state`.

    Raises:
        KeyError: ``state`` lacks one of ``python``, ``numpy``, ``torch``.
    """
    for key in ('python', 'numpy', 'torch'):
        if key not in state:
            raise KeyError(f'RNG state: expected the key {key!r}, got {sorted(state)}')
    version, internal, gauss_next = state['python']
    random.setstate((version, tuple(internal), gauss_next))
    np_state = state['numpy']
    np.random.set_state((np_state['name'], np_state['keys'].numpy().astype(np.uint32),
                         np_state['pos'], np_state['has_gauss'], np_state['gauss']))
    torch.set_rng_state(state['torch'])
    cuda = state.get('cuda') or []
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


@contextlib.contextmanager
def preserved_rng_state() -> Iterator[Dict]:
    """Run a block (e.g. validation) without it moving the training random streams.

    Yields the state captured on entry; it is restored on exit.
    """
    state = capture_rng_state()
    try:
        yield state
    finally:
        restore_rng_state(state)
