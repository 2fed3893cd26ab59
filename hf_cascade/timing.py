"""Comparing alternatives by time, the way every run-time measurement of the package does it.

Decisions made from timings (whether the argmax screen beats the head, how many rows a head call may take, what
verifying ``n`` tree nodes costs, a drafter's cost) compare alternatives on the running machine. They are timed
*interleaved* -- every alternative once per round -- so that a machine's drift (frequency, other load) spreads over
all of them, and compared by *median*, which one preempted call does not move. Where a drift within a round would
bias the comparison (a process still warming up, another one starting), a *symmetric* round times the alternatives
in order and then in reverse, and takes each one's mean: a drift linear over the round then cancels, since both
halves of every alternative are centred on the round's middle. The first rounds warm up (allocations, kernel
choice, caches) and are discarded.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Hashable, Mapping


def interleaved_medians(runs: Mapping[Hashable, Callable[[], object]], repeats: int, warmup: int = 1,
                        symmetric: bool = False, clock: Callable[[], float] = time.perf_counter,
                        sync: Callable[[], None] | None = None,
                        self_timed: bool = False) -> dict[Hashable, float]:
    """``{key: median seconds}`` of ``runs`` over ``repeats`` rounds after ``warmup`` discarded ones.

    Args:
        runs: the alternatives, ``{key: fn}``, each called once per round in this order (with ``symmetric``: in
            this order and then in reverse, twice per timed round, the round's sample the mean of the two).
        clock: the clock read around each call (e.g. a kernel tuner's own).
        sync: called before each clock read (a device synchronisation: a GPU runs asynchronously).
        self_timed: each ``fn`` returns its own measure in seconds (e.g. excluding a prefill) instead.
    """
    keys = list(runs)
    times: dict[Hashable, list[float]] = {k: [] for k in keys}
    for round_ in range(warmup + repeats):
        timed = round_ >= warmup
        order = keys + keys[::-1] if symmetric and timed else keys        # a warm-up round runs each once
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
            for k in keys:
                times[k].append(sample[k])
    return {k: statistics.median(t) for k, t in times.items()}


__all__ = ["interleaved_medians"]
