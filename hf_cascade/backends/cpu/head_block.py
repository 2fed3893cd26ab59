"""How many rows one output-head call computes: the block that makes the fewest, cheapest calls for the steps a
strategy verifies.

Acceptance reads the rows of a verified draft one after another along the path it accepts
(:class:`~hf_cascade.core.rows.TreeRows`): a step that reads ``r`` rows of ``n + 1`` verified makes
``ceil(r / b)`` head calls with blocks of ``b`` rows, the ``j``-th over ``min(b, n + 1 - j b)`` rows. On a CPU
one call over a few rows costs about one pass over the head's weight, and what a row more costs depends on the
machine and the product (the float32 head; the argmax screen, whose integer pass grows faster with the rows). So
the block is priced, not guessed:

* **The cost of a call of** ``m`` **rows**, ``c(m)`` relative to one row, is timed once per process and head shape
  for ``m`` in :data:`SIZES` (interleaved symmetric rounds), pooled with the last processes' rounds on this machine
  (:mod:`hf_cascade.profile_rounds`), and fitted non-decreasing (:func:`~hf_cascade.timing.monotone_profile`): a
  size timed too dear beside a busy neighbour is pooled with the larger ones instead of ruling them out. Where the
  head has an argmax screen (:mod:`.argmax_screen`), a call costs what the cheaper of the head and the screen costs
  at that size: greedy acceptance, and sampling with a top-k filter, read the rows through the screen where it is
  faster.
* **The steps** are this process's last :data:`WINDOW` steps of the same strategy kind on this head (rows
  verified, rows read = tokens emitted), recorded after each ``generate()`` call (:func:`record_steps`), beside a
  prior of :data:`PRIOR_WEIGHT` steps: drafts of :data:`PRIOR_ROWS` rows whose path continues with probability
  :data:`PRIOR_CONTINUE` at each row (about 2.4 tokens per call, what the model-free strategies reach on
  Spec-Bench). A first call uses the prior; later ones their strategy's own acceptance.
* **The block** is the size of :data:`SIZES` with the least expected head cost per step,
  ``sum_j c(min(b, n + 1 - j b))`` over the ``ceil(r / b)`` calls.

The earlier rule ("the largest size costing at most 1.2 one-row calls") read a cost curve that is nearly flat over
1-4 rows as a coin toss between 2 and 4 rows, and chose small blocks on disturbed start-ups; a block too small makes
every long accepted path pay a second call, one too large pays rows no step reads
(``docs/results/ab-2f060f7-94ecbef-1x13-128-xeon``). Only speed depends on the block, never an output.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

import torch

from ...profile_rounds import keep_rounds, kept_rounds, rounds_to_measure, store_key
from ...timing import interleaved_medians, median_ratios, monotone_profile

#: The block sizes timed and chosen from.
SIZES = (1, 2, 3, 4, 8)
#: The prior: drafts of ``PRIOR_ROWS`` rows, the path continuing with ``PRIOR_CONTINUE`` per row, worth
#: ``PRIOR_WEIGHT`` observed steps.
PRIOR_ROWS, PRIOR_CONTINUE, PRIOR_WEIGHT = 8, 0.6, 32.0
#: Steps kept per (head shape, strategy kind).
WINDOW = 1024

Steps = list[tuple[int, int, float]]  # (rows verified, rows read, weight)


def prior_steps(rows: int = PRIOR_ROWS, p: float = PRIOR_CONTINUE, weight: float = PRIOR_WEIGHT) -> Steps:
    """The prior's steps: ``rows`` verified, ``r`` read with probability ``p^(r-1) (1-p)`` (``p^(rows-1)`` for all)."""
    return [(rows, r, weight * (p ** (r - 1)) * ((1 - p) if r < rows else 1.0)) for r in range(1, rows + 1)]


def step_cost(costs: tuple[float, ...], block: int, verified: int, read: int) -> float:
    """Head cost of one step (in one-row calls) with blocks of ``block`` rows: ``costs[m - 1]`` is a call of ``m``
    rows (calls over more rows than ``costs`` covers cost its last entry)."""
    total, done = 0.0, 0
    while done < read:
        total += costs[min(block, verified - done, len(costs)) - 1]
        done += block
    return total


def priced_block(costs: tuple[float, ...], steps: Steps, sizes: Iterable[int] = SIZES) -> int:
    """The size of ``sizes`` with the least expected head cost over ``steps`` (ties: the larger)."""

    def expected(b: int) -> float:
        return sum(w * step_cost(costs, b, n1, r) for n1, r, w in steps)

    return min(sorted(sizes, reverse=True), key=expected)


# -- the cost curve: timed once per process and head shape ---------------------------------------------------

#: Fitted costs ``(c(1), ..., c(max SIZES))`` by head shape key.
_COSTS: dict[tuple, tuple[float, ...]] = {}


def call_costs(
    key: tuple, calls: dict[int, list[Callable[[], object]]], label: str, clock: Callable[[], float], repeats: int = 5
) -> tuple[float, ...]:
    """The fitted relative costs of a call over ``m`` rows, ``m`` in :data:`SIZES` (``calls[m]``: the products that
    can make it; each call costs its cheapest one's median), measured once per process and ``key``, pooled with the
    kept rounds filed under ``label`` (see the module docstring)."""
    if key not in _COSTS:
        filed = store_key((label, *key), {"sizes": list(SIZES), "repeats": repeats, "products": len(calls[SIZES[0]])})
        kept = kept_rounds(filed)
        new = []
        if rounds_to_measure(len(kept)):  # none under HF_CASCADE_PROFILE_ROUNDS=reuse
            runs = {(m, i): fn for m in SIZES for i, fn in enumerate(calls[m])}
            seconds = interleaved_medians(runs, repeats, warmup=1, symmetric=True, clock=clock)
            best = {m: min(seconds[(m, i)] for i in range(len(calls[m]))) for m in SIZES}
            new = [{m: best[m] / best[SIZES[0]] for m in SIZES}]
            keep_rounds(filed, new)
        pooled = median_ratios(kept + new)
        _COSTS[key] = monotone_profile({m - 1: pooled[m] for m in SIZES})  # index m - 1: a call of m rows
    return _COSTS[key]


def costs_of(key: tuple) -> tuple[float, ...] | None:
    """The fitted costs measured for ``key`` in this process, if any."""
    return _COSTS.get(key)


# -- the steps: recorded per process, head shape and strategy kind ------------------------------------------

_STEPS: dict[tuple, deque] = {}
#: The last choice per (head shape key, kind), a run's record.
CHOSEN: dict[tuple, int] = {}


def record_steps(key: tuple, kind: str, drafted: list[int], accepted: list[int]) -> None:
    """Keep one call's steps: ``drafted[i]`` nodes verified and ``accepted[i]`` accepted at step ``i`` (host ints,
    a :class:`~hf_cascade.core.stats.GenerationStats`' ``draft_len_per_call`` and ``accepted_per_call``)."""
    window = _STEPS.setdefault((key, kind), deque(maxlen=WINDOW))
    window.extend((n + 1, a + 1) for n, a in zip(drafted, accepted))


def steps_of(key: tuple, kind: str) -> Steps:
    """The prior's steps and the kept ones of ``kind`` on ``key`` (weight 1 each)."""
    counts: dict[tuple[int, int], float] = {}
    for step in _STEPS.get((key, kind), ()):
        counts[step] = counts.get(step, 0.0) + 1.0
    return prior_steps() + [(n1, r, w) for (n1, r), w in counts.items()]


def choose(key: tuple, kind: str, costs: tuple[float, ...]) -> int:
    """The block for the next call of ``kind`` on ``key`` (recorded in :data:`CHOSEN`)."""
    CHOSEN[(key, kind)] = block = priced_block(costs, steps_of(key, kind))
    return block


def chosen_blocks() -> list[dict]:
    """The blocks chosen in this process, per head shape, thread count and strategy kind (the last call's)."""
    return [
        {"weight": list(key.weight[0]), "threads": key.threads, "kind": kind, "block_rows": rows}
        for (key, kind), rows in CHOSEN.items()
    ]


def reset() -> None:
    """Forget every measured curve, step and choice of this process (tests: a new process)."""
    _COSTS.clear()
    _STEPS.clear()
    CHOSEN.clear()


def rows_input(width: int, dtype: torch.dtype) -> dict[int, torch.Tensor]:
    """Inputs of each timed size (a fixed seed: the screen's work depends on the rows' values)."""
    g = torch.Generator().manual_seed(0)
    return {m: torch.randn(m, width, generator=g, dtype=torch.float32).to(dtype) * 3 for m in SIZES}


__all__ = [
    "CHOSEN",
    "PRIOR_CONTINUE",
    "PRIOR_ROWS",
    "PRIOR_WEIGHT",
    "SIZES",
    "WINDOW",
    "call_costs",
    "choose",
    "costs_of",
    "chosen_blocks",
    "priced_block",
    "prior_steps",
    "record_steps",
    "reset",
    "rows_input",
    "step_cost",
    "steps_of",
]
