"""Wall-clock timing of calls, synchronised on CUDA: what the benchmark tools share."""
import time
from typing import Callable, List

import torch

__all__ = ['timed_calls', 'sgemm_seconds', 'sgemm_gflops', 'SGEMM_SIZE']

#: side of the fp32 square matrix product that measures the machine's matrix-multiply rate
SGEMM_SIZE = 2048


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


def sgemm_seconds(device, size: int = SGEMM_SIZE) -> Callable[[], float]:
    """A callable timing one fp32 ``size x size`` matrix product (seconds) on ``device``.

    Its rate ``2 * size**3 / seconds`` is the machine's matrix-multiply limit that
    the benchmarks' efficiencies and GEMM floors are measured against, in the
    same process and interleaved with the timed calls.
    """
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=gen).to(device) for _ in range(2))
    a @ b

    def timed():
        return timed_calls(lambda: a @ b, device, 1)[0]

    return timed


def sgemm_gflops(seconds: float, size: int = SGEMM_SIZE) -> float:
    """The rate (GFLOP/s) of one ``size x size`` fp32 product timed at ``seconds`` (:func:`sgemm_seconds`)."""
    return 2 * size ** 3 / seconds / 1e9
