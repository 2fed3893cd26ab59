"""Comparing alternatives by time, the way every run-time measurement of the package does it.

Decisions made from timings (whether the argmax screen beats the head, how many rows a head call may take, what
verifying ``n`` tree nodes costs, a drafter's cost) compare alternatives on the running machine. They are timed
*interleaved* -- every alternative once per round -- so that a machine's drift (frequency, other load) spreads over
all of them, and compared by *median*, which one preempted call does not move. Where a drift within a round would
bias the comparison (a process still warming up, another one starting), a *symmetric* round times the alternatives
in order and then in reverse, and takes each one's mean: a drift linear over the round then cancels, since both
halves of every alternative are centred on the round's middle. The first rounds warm up (allocations, kernel
choice, caches) and are discarded.

A transient that is not linear over a round (another process loading a model beside this one) still spoils that
round. Where one timed choice sizes everything after it, it is the median of several rounds' ratios
(:func:`round_ratios`, :func:`median_ratios`), a spoiled round outvoted instead of trusted.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Iterator, Mapping


def _timed_rounds(
    runs: Mapping[Hashable, Callable[[], object]],
    warmup: int,
    symmetric: bool,
    clock: Callable[[], float],
    sync: Callable[[], None] | None,
    self_timed: bool,
) -> Iterator[dict[Hashable, float]]:
    """``{key: seconds}`` of each timed round, endlessly, after ``warmup`` discarded ones (the rules of
    :func:`interleaved_medians`)."""
    keys = list(runs)
    round_ = 0
    while True:
        timed = round_ >= warmup
        round_ += 1
        order = keys + keys[::-1] if symmetric and timed else keys  # a warm-up round runs each once
        sample = dict.fromkeys(keys, 0.0)
        for k in order:
            if self_timed:
                seconds = float(runs[k]())
            else:
                if sync is not None:
                    sync()
                start = clock()
                runs[k]()
                if sync is not None:
                    sync()
                seconds = clock() - start
            sample[k] += seconds / (2 if symmetric and timed else 1)
        if timed:
            yield sample


def interleaved_medians(
    runs: Mapping[Hashable, Callable[[], object]],
    repeats: int,
    warmup: int = 1,
    symmetric: bool = False,
    clock: Callable[[], float] = time.perf_counter,
    sync: Callable[[], None] | None = None,
    self_timed: bool = False,
) -> dict[Hashable, float]:
    """``{key: median seconds}`` of ``runs`` over ``repeats`` rounds after ``warmup`` discarded ones.

    Args:
        runs: the alternatives, ``{key: fn}``, each called once per round in this order (with ``symmetric``: in
            this order and then in reverse, twice per timed round, the round's sample the mean of the two).
        clock: the clock read around each call (e.g. a kernel tuner's own).
        sync: called before each clock read (a device synchronisation: a GPU runs asynchronously).
        self_timed: each ``fn`` returns its own measure in seconds (e.g. excluding a prefill) instead.
    """
    rounds = _timed_rounds(runs, warmup, symmetric, clock, sync, self_timed)
    samples = [next(rounds) for _ in range(repeats)]
    return {k: statistics.median(s[k] for s in samples) for k in runs}


def round_ratios(
    runs: Mapping[Hashable, Callable[[], object]],
    unit: Hashable,
    rounds: int,
    warmup: int = 1,
    symmetric: bool = True,
    clock: Callable[[], float] = time.perf_counter,
    sync: Callable[[], None] | None = None,
    self_timed: bool = False,
) -> list[dict[Hashable, float]]:
    """Each timed round's ``{key: time / unit's time}`` (the rules of :func:`interleaved_medians`, symmetric by
    default): ratios within a round, so a round slowed evenly keeps them, and rounds that can be pooled with rounds
    measured elsewhere (:mod:`hf_cascade.profile_rounds`)."""
    timed = _timed_rounds(runs, warmup, symmetric, clock, sync, self_timed)
    samples = [next(timed) for _ in range(max(int(rounds), 1))]
    return [{k: s[k] / s[unit] for k in runs} for s in samples]


def median_ratios(rounds: list[Mapping[Hashable, float]]) -> dict[Hashable, float]:
    """The per-key median over ``rounds`` (dicts with the same keys): a round spoiled by a transient is outvoted."""
    return {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}


def monotone_profile(measured: dict[int, float]) -> tuple[float, ...]:
    """The profile ``relative[0 .. max n]`` from measured relative costs at some node counts (``{n: cost}``, ``0``
    the unit): the least-squares non-decreasing fit of the measured points (isotonic regression, pool adjacent
    violators) at least 1, linear in between. A point measured too high (a timing spike) is pooled with the points
    after it, not carried over them as a running maximum would: that made every larger size look as cheap as the
    spike, and trees grow to the next measured size."""
    sizes = sorted(n for n in measured if n > 0)
    blocks: list[list[float]] = []  # [sum, count] of each pooled run of sizes
    for n in sizes:
        blocks.append([float(measured[n]), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    fitted = {0: 1.0}
    i = 0
    for total, count in blocks:
        for _ in range(int(count)):
            fitted[sizes[i]] = max(1.0, total / count)
            i += 1
    grid = [0, *sizes]
    rel = [1.0]
    for n in range(1, grid[-1] + 1):
        lo = max(m for m in grid if m <= n)
        hi = min(m for m in grid if m >= n)
        rel.append(fitted[lo] if hi == lo else fitted[lo] + (fitted[hi] - fitted[lo]) * (n - lo) / (hi - lo))
    return tuple(rel)


__all__ = ["interleaved_medians", "median_ratios", "monotone_profile", "round_ratios"]
