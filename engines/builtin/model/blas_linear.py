"""Float32 linears on numpy's BLAS for small steps on the CPU.

torch's float32 matrix-vector products (MKL sgemv) read weights at 16 GB/s on this
machine's AMD EPYC, a third of its memory bandwidth (a sum reads 43 GB/s); numpy's
OpenBLAS reads them at 43 GB/s. A decode step of the default model is one pass over its
538 MB of weights, so that is the difference between 36 and 17 ms per step (measured:
docs/benchmarks.md, "CPU engine speed, second pass"). The linears stay the same float32
products, only summed in another order; the exact mode's parity tests run on this path.

The two libraries keep a thread pool each, and idle threads of one spin against the
workers of the other: with both busy in one step, a 128-token prefill took 1.1 s instead
of 0.2 s. So each step uses one of them (:class:`MatmulRoute`): decode-sized steps
multiply on BLAS with torch single-threaded (its other ops are tiny there), larger steps
(prefill, long contexts) on torch with all its threads while BLAS idles.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

AUTO_MIN_SPEEDUP = 1.15  # "auto" takes BLAS when it is at least this much faster


@dataclass
class MatmulRoute:
    """Which library a step's float32 linears use; set by the runner before each step.

    A step goes to BLAS when it has few rows and attends few keys: single-threaded,
    torch's decode attention costs ~2 us more per attended key and step than on two
    threads, which outweighs BLAS's faster products from about 10,000 keys on (measured
    on the default model: 8 x 1,024 keys 82 ms on BLAS against 97 ms on torch, 16 x 1,024
    keys 235 against 193 ms).
    """

    max_rows: int  # steps of at most this many rows go to BLAS ...
    max_keys: int  # ... if their sequences attend at most this many keys in all
    threads: int  # torch threads for the other steps, and BLAS threads
    blas: bool = False  # what the current step uses

    def begin_step(self, rows: int, keys: int = 0) -> None:
        blas = rows <= self.max_rows and keys <= self.max_keys
        if blas != self.blas:
            torch.set_num_threads(1 if blas else self.threads)
            self.blas = blas


class BlasLinear(nn.Module):
    """An ``nn.Linear``'s float32 weights, multiplied on BLAS while the route says so."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, route: MatmulRoute) -> None:
        super().__init__()
        self.weight = weight  # [out, in] float32, shared with the model (not copied)
        self.bias = bias
        self.route = route
        self.weight_t = weight.detach().numpy().T  # [in, out] view of the same memory

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [rows, in] -> [rows, out]
        if not self.route.blas or x.dim() != 2:
            return F.linear(x, self.weight, self.bias)
        out = torch.from_numpy(np.matmul(x.detach().numpy(), self.weight_t))
        return out if self.bias is None else out + self.bias


def blas_speedup(weight: torch.Tensor, threads: int, repeats: int = 5) -> float:
    """How many times faster one row times ``weight`` [out, in] runs on BLAS than on torch."""
    x = torch.randn(1, weight.shape[1])
    w_t = weight.detach().numpy().T

    def best(fn) -> float:
        fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    with torch.inference_mode():
        torch.set_num_threads(threads)
        on_torch = best(lambda: F.linear(x, weight))
        torch.set_num_threads(1)
        on_blas = best(lambda: np.matmul(x.numpy(), w_t))
        torch.set_num_threads(threads)
    return on_torch / on_blas
