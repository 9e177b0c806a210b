"""Wall-clock timing of calls, synchronised on CUDA: what the benchmark tools share."""
import time
from typing import Callable, List

import torch

__all__ = ['timed_calls']


def timed_calls(call: Callable[[], object], device, repeat: int) -> List[float]:
    """Seconds of each of ``repeat`` calls of ``call()``; on CUDA the device is synchronised before and after each."""
    cuda = str(device).startswith('cuda')
    times = []
    for _ in range(repeat):
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        call()
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return times
