"""Choosing between kernels that compute the same product, by timing the real calls.

The target's verification forwards multiply a few rows ``x`` (``[m, d_in]``, ``m`` = tokens verified)
by each weight ``W`` (``[d_out, d_in]``). ``F.linear(x, W)`` and ``W @ x.T`` give the same products in
a different order of accumulation, and which one is faster depends on the CPU and its BLAS. Measured
with the same torch 2.13 CPU wheel (MKL) and 2 threads on two 2-core x86 machines, Gemma-3-270M's
head (262k x 640 fp32):

* machine A: ``F.linear`` 52 ms for 1 row and 250-500 ms for 6; ``W @ x.T`` 34 ms for 1 row (*),
  34 ms for 2 and 4 rows, 58 ms for 8. Its 126 decoder linears: ``F.linear`` ~24 ms for 1 row,
  35-47 ms for 2-4 rows; ``W @ x.T`` 17-26 ms for 2-4 rows.
* machine B (a Xeon with AVX-512): ``F.linear`` 22.5 / 24.7 / 48.9 / 78.4 / 52.6 ms for 1 / 2 / 4 / 8 /
  16 rows; ``W @ x.T`` 22.8 ms for 1 row and ~59 ms for 2-16.

(*) one row computed as a 2-row product with a zero row. On machine A the one-row and few-row
``F.linear`` kernels ran on one thread; on machine B they use both. The fixed choice that was fastest
on A (``W @ x.T`` for 2-64 rows, the head's single row as a 2-row product) made a one-token target
forward on B 1.75x slower (97 vs 55 ms). :class:`KernelTuner` therefore decides per call shape
(weight shape and layout, rows, threads): the first ``trials`` calls of a shape alternate between the
candidate kernels on the real inputs, and the one with the lowest median time is used from then on,
for the rest of the process. Nothing is computed twice; exploring costs at most
``trials`` calls of the slower kernel per shape.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Hashable

import torch

Kernels = dict[str, Callable[[], torch.Tensor]]


def left_product(weight: torch.Tensor, rows: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(rows, weight, bias)`` computed as ``(weight @ rows.T).T``: ``[m, d_in] -> [m, d_out]``, the
    weight as the left operand (a transposed view; callers that need it contiguous copy it)."""
    out = (weight @ rows.T).T
    return out + bias if bias is not None else out


def rows_bucket(m: int) -> int:
    """The row count a choice is keyed by: exact up to 4, then the next power of two (kernel speed
    changes in steps with the number of rows; fewer keys mean less exploring)."""
    return m if m <= 4 else 1 << (m - 1).bit_length()


def shape_key(weight: torch.Tensor, m: int) -> tuple:
    """The key of a product of ``m`` rows with ``weight``: its shape, layout, dtype, device, the row
    bucket and the thread count."""
    return (tuple(weight.shape), weight.stride(), weight.dtype, weight.device.type, rows_bucket(m),
            torch.get_num_threads())


@dataclass
class KernelTuner:
    """Runs the fastest of several equivalent kernels per key, learned from the calls themselves.

    Args:
        trials: timed calls of each kernel before a key's choice is made.
        force: always use the kernel of this name where a call offers it (tests, or a user who knows
            their machine); ``None``: choose by timing.
        clock: the timer (seconds).
    """

    trials: int = 3
    force: str | None = None
    clock: Callable[[], float] = time.perf_counter
    _times: dict[Hashable, dict[str, list[float]]] = field(default_factory=dict)
    _choice: dict[Hashable, str] = field(default_factory=dict)
    _seconds: dict[Hashable, float] = field(default_factory=dict)

    def run(self, key: Hashable, kernels: Kernels) -> torch.Tensor:
        """The result of one of ``kernels`` (each computes the same product)."""
        if self.force is not None and self.force in kernels:
            return kernels[self.force]()
        name = self._choice.get(key)
        if name is None and len(kernels) == 1:
            name = next(iter(kernels))
        if name is not None:
            return kernels[name]()
        times = self._times.setdefault(key, {n: [] for n in kernels})
        name = min(kernels, key=lambda n: len(times[n]))                 # the least tried, in order
        t0 = self.clock()
        out = kernels[name]()
        times[name].append(self.clock() - t0)
        if all(len(times[n]) >= self.trials for n in kernels):
            best = min(kernels, key=lambda n: statistics.median(times[n]))
            self._choice[key], self._seconds[key] = best, statistics.median(times[best])
            del self._times[key]
        return out

    def seconds(self, key: Hashable) -> float | None:
        """Median time of the chosen kernel of ``key`` while it was explored (``None``: not decided)."""
        return self._seconds.get(key)

    def choices(self) -> dict[Hashable, str]:
        """The choices made so far, by key."""
        return dict(self._choice)

    def reset(self) -> None:
        """Forget every measurement and choice."""
        self._times.clear()
        self._choice.clear()
        self._seconds.clear()


#: The process-wide tuner of the target's CPU kernels (:mod:`hf_cascade.verify_linear`, :mod:`hf_cascade.verify_head`).
TUNER = KernelTuner()

__all__ = ["KernelTuner", "TUNER", "left_product", "rows_bucket", "shape_key"]
