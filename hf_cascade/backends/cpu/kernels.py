"""Choosing between kernels that compute the same product, by timing the real calls.

The target's verification forwards multiply a few rows ``x`` (``[m, d_in]``, ``m`` = tokens verified)
by each weight ``W`` (``[d_out, d_in]``). ``F.linear(x, W)``, ``W @ x.T`` and a product with a copy of
the weight in another layout give the same products in a different order of accumulation, and which
one is fastest depends on the CPU, its BLAS, the weight's shape, the number of rows and of threads: a
fixed choice that is fastest on one machine can be much slower on another. :class:`KernelTuner`
therefore decides per call shape (weight shape and layout, rows, threads): the first ``trials`` calls
of a shape alternate between the candidate kernels on the real inputs, and the one with the lowest
median time is used from then on, until the key is explored again after ``recheck_every`` uses.
Nothing is computed twice; exploring costs at most ``trials`` calls of each slower kernel per shape
and recheck.

One candidate, ``packed`` (:class:`WeightPacker`), multiplies by a copy of the weight reordered once
into oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``, the layout
``torch.compile``'s CPU backend also uses for frozen linears); its subclass
:class:`~hf_cascade.backends.cpu.panel.PanelPacker` is the compiled ``panel`` kernel. The price of a copy
is memory: as large as the weight it copies, made the first time the tuner tries it and kept while
the weight lives. Measurements: ``docs/cpu-kernels.md``.
"""

from __future__ import annotations

import functools
import statistics
import time
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

import torch

Kernels = dict[str, Callable[[], torch.Tensor]]


def left_product(weight: torch.Tensor, rows: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(rows, weight, bias)`` computed as ``(weight @ rows.T).T``: ``[m, d_in] -> [m, d_out]``, the
    weight as the left operand (a transposed view; callers that need it contiguous copy it)."""
    out = (weight @ rows.T).T
    return out + bias if bias is not None else out


@functools.cache
def _onednn_packs() -> bool:
    """Whether this torch build has oneDNN's weight packing (checked once: ``offers`` runs on every call)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


@dataclass
class WeightPacker:
    """Copies of weights in oneDNN's blocked layout for :func:`torch.ops.mkldnn._linear_pointwise`, made
    once per weight (and again after an in-place update of it) and dropped with the weight.

    Subclasses change the layout and the product (``available``, ``_pack``, ``_multiply``;
    :class:`hf_cascade.backends.cpu.panel.PanelPacker`); the bookkeeping of the copies is this class's.

    Args:
        enabled: offer the kernel at all (``False``: never pack; saves the copies' memory).
        batch_hint: the row count oneDNN's layout is tuned for (any row count works).
    """

    kernel: ClassVar[str] = "packed"  # the kernel's name among the tuner's candidates
    enabled: bool = True
    batch_hint: int = 8
    _packed: dict[int, tuple[int, torch.Tensor]] = field(default_factory=dict)

    def available(self) -> bool:
        """Whether this build of torch can make and use the copies (checked once per process)."""
        return _onednn_packs()

    def offers(self, weight: torch.Tensor) -> bool:
        """Whether the kernel can run for ``weight`` (float32 on the CPU, and :meth:`available`)."""
        return (
            self.enabled
            and weight.dtype == torch.float32
            and weight.device.type == "cpu"
            and weight.dim() == 2
            and self.available()
        )

    def packed(self, weight: torch.Tensor) -> torch.Tensor:
        """The packed copy of ``weight`` ``[d_out, d_in]`` (made now if missing or stale)."""
        entry = self._packed.get(id(weight))
        if entry is None or entry[0] != weight._version:
            if entry is None:
                weakref.finalize(weight, self._packed.pop, id(weight), None)
            with torch.no_grad():
                entry = (weight._version, self._pack(weight.detach()))
            self._packed[id(weight)] = entry
        return entry[1]

    def product(self, weight: torch.Tensor, rows: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``F.linear(rows, weight, bias)`` with the packed weight: ``[m, d_in] -> [m, d_out]``. Where the
        packed product fails, it falls back to ``F.linear`` and packing is disabled."""
        try:
            return self._multiply(rows.contiguous(), self.packed(weight), weight, bias)
        except RuntimeError:
            self.enabled = False
            self.clear()
            return torch.nn.functional.linear(rows, weight, bias)

    def _pack(self, weight: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._reorder_linear_weight(weight, self.batch_hint)

    def _multiply(
        self, rows: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")

    def clear(self) -> None:
        """Drop every packed copy."""
        self._packed.clear()


def rows_bucket(m: int) -> int:
    """The row count a choice is keyed by: exact up to 8, then the next power of two (kernel speed
    changes in steps with the number of rows; fewer keys mean less exploring). Up to 8 rows, the
    counts verification uses most, every count has its own key: a shared bucket mixes timings of
    counts whose fastest kernels differ."""
    return m if m <= 8 else 1 << (m - 1).bit_length()


class ShapeKey(NamedTuple):
    """A product's key: the weight (shape, layout, dtype, device), the row bucket and the thread count."""

    weight: tuple
    rows: int
    threads: int


def shape_key(weight: torch.Tensor, m: int) -> ShapeKey:
    """The key of a product of ``m`` rows with ``weight``: its shape, layout, dtype, device, the row
    bucket and the thread count."""
    return ShapeKey(
        (tuple(weight.shape), weight.stride(), weight.dtype, weight.device.type),
        rows_bucket(m),
        torch.get_num_threads(),
    )


@dataclass
class KernelTuner:
    """Runs the fastest of several equivalent kernels per key, learned from the calls themselves.

    Args:
        trials: timed calls of each kernel before a key's choice is made.
        force: always use the kernel of this name where a call offers it (tests, or a user who knows
            their machine); ``None``: choose by timing.
        recheck_every: after this many calls with a key's choice, explore that key again (``0``: never).
            A choice timed while something else loaded the CPU would otherwise stay for the whole
            process. Re-exploring costs ``trials`` calls of each other kernel; a recheck that
            confirms the choice doubles that key's interval (a choice that changes resets it), so a
            stable machine pays less and less for it.
        clock: the timer (seconds).
        behind: a kernel whose median is more than ``behind`` times the chosen one's at a
            :class:`ShapeKey` is not explored for that weight at more rows (until a recheck measures it
            within ``behind`` again at those rows): a kernel's cost grows with its rows, and one
            far behind at a few rows does not catch up at more, while exploring it there costs
            ``trials`` of its slowest calls per row bucket (a kernel built for another instruction set,
            a register-starved product). Keys of other kinds are explored in full.
    """

    trials: int = 3
    force: str | None = None
    recheck_every: int = 512
    clock: Callable[[], float] = time.perf_counter
    behind: float = 2.0
    _behind: dict[Hashable, dict[str, int]] = field(default_factory=dict)  # weight -> kernel -> fewest rows
    _times: dict[Hashable, dict[str, list[float]]] = field(default_factory=dict)
    _choice: dict[Hashable, str] = field(default_factory=dict)
    _seconds: dict[Hashable, float] = field(default_factory=dict)
    _uses: dict[Hashable, int] = field(default_factory=dict)
    _interval: dict[Hashable, tuple[str, int]] = field(default_factory=dict)  # last choice, its recheck interval

    def run(self, key: Hashable, kernels: Kernels) -> torch.Tensor:
        """The result of one of ``kernels`` (each computes the same product)."""
        if self.force is not None and self.force in kernels:
            return kernels[self.force]()
        if len(kernels) == 1:
            return next(iter(kernels.values()))()
        name = self._choice.get(key)
        if name in kernels:
            uses = self._uses[key] = self._uses.get(key, 0) + 1
            if not self.recheck_every or uses < self._interval[key][1]:
                return kernels[name]()
        self._choice.pop(key, None)  # explore: none yet, a recheck, or
        self._uses.pop(key, None)  # the choice is no longer offered
        times = self._times.setdefault(key, {})
        candidates = self._candidates(key, kernels)
        for n in candidates:
            times.setdefault(n, [])
        name = min(candidates, key=lambda n: len(times[n]))  # the least tried, in order
        t0 = self.clock()
        out = kernels[name]()
        times[name].append(self.clock() - t0)
        if all(len(times[n]) >= self.trials for n in candidates):
            medians = {n: statistics.median(times[n]) for n in candidates}
            best = min(candidates, key=medians.get)
            self._choice[key], self._seconds[key] = best, medians[best]
            del self._times[key]
            last, interval = self._interval.get(key, (None, 0))
            self._interval[key] = (best, 2 * interval if best == last else self.recheck_every)
            self._note_behind(key, medians, medians[best])
        return out

    def _candidates(self, key: Hashable, kernels: Kernels) -> list[str]:
        """The kernels to explore for ``key``: all but those far behind at fewer rows (``behind``)."""
        if not isinstance(key, ShapeKey):
            return list(kernels)
        behind = self._behind.get(key.weight, {})
        kept = [n for n in kernels if behind.get(n, key.rows) >= key.rows]
        return kept or list(kernels)

    def _note_behind(self, key: Hashable, medians: dict[str, float], best: float) -> None:
        if not isinstance(key, ShapeKey) or self.behind <= 0:
            return
        behind = self._behind.setdefault(key.weight, {})
        for n, t in medians.items():
            if t > self.behind * best:
                behind[n] = min(behind.get(n, key.rows), key.rows)
            elif behind.get(n) == key.rows:  # measured within reach again here
                del behind[n]

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
        self._uses.clear()
        self._interval.clear()
        self._behind.clear()


#: The process-wide tuner of the target's CPU kernels (:mod:`hf_cascade.backends.cpu.verify_linear`,
#: :mod:`hf_cascade.backends.cpu.verify_head`).
TUNER = KernelTuner()

#: The process-wide packed weights of the ``packed`` kernel.
PACKER = WeightPacker()

__all__ = ["KernelTuner", "PACKER", "ShapeKey", "TUNER", "WeightPacker", "left_product", "rows_bucket", "shape_key"]
