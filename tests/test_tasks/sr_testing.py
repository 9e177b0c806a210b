"""Helpers shared by the super-resolution tests: the configs, a tiny network, image writing."""
import os
import os.path as osp

import pytest
import torch

from conftest import REPO_ROOT
from polaformerpp.restoration.transforms import write_rgb

SR_CONFIGS = {s: osp.join(REPO_ROOT, 'configs', 'super_resolution',
                          f'polapp-srlight_x{s}_8xb16-500k_div2k-192.py') for s in (2, 3, 4)}


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Run these small-op workloads on one thread (restored afterwards).

    The network is many small ops: a second thread gains little, and on a
    machine busy with other work OpenMP barriers make it 10-20x slower.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def write(path, img):
    os.makedirs(osp.dirname(path), exist_ok=True)
    write_rgb(path, img)
