"""The block: how many rows of logits one output-head call computes, chosen per step from this call's measurements.

Acceptance reads a verified draft's rows one at a time along the path it walks (:mod:`hf_cascade.core.rows`), and
:class:`~hf_cascade.core.rows.TreeRows` computes a missing row together with the next rows of its chain, at most a
*block* of them per call. Every head call reads the head's whole weight once, and every row costs its own work, so
the call's cost is modelled as ``a + s * m`` for ``m`` rows: a block that is too small pays ``a`` again when
acceptance reads past it; one too large pays ``s`` for rows it never reads. Both terms depend on the machine,
the kernel acceptance calls (the head, or the backend's argmax screen) and the prompt; the rows read depend on
the drafter and the prompt. So neither is assumed:

* :class:`CallCost` fits ``a`` and ``s`` to this call's own head calls (their rows and measured seconds; per
  row count the median of its recent calls, so that the backend's first calls at a new row count, which try
  its kernels, do not dominate);
* :class:`BlockChooser` replays the last ``window`` steps (rows acceptance read, rows the draft had) under every
  block from 1 to ``max_block`` (:func:`replay_seconds`) and takes the cheapest; where the replay cannot tell
  blocks apart (every draft shorter than both, or no cost per row), it keeps the block it has.

Until the fit has two row counts and ``min_steps`` steps, the session's block is used (the CPU backend's
calibration, :func:`~hf_cascade.backends.cpu.verify_head.calibrate_block_rows`). The block decides only which
rows are computed in which call, never which are accepted, so it is lossless. The timings are host clock reads
around calls the CPU has finished (the loop uses a chooser only for targets on the CPU, where no call is
asynchronous; accelerators compute every row at once). State is per ``generate()`` call.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from statistics import median


def replay_seconds(block: int, read: int, rows: int, fixed: float, per_row: float) -> float:
    """Seconds of the head calls acceptance makes reading ``read`` rows of a draft with ``rows`` rows (root
    included) in blocks of ``block``: each call computes ``min(block, rows left)`` rows at ``fixed + per_row * m``."""
    seconds, done = 0.0, 0
    while done < min(read, rows):
        m = min(block, rows - done)
        seconds += fixed + per_row * m
        done += m
    return seconds


class CallCost:
    """``a + s * m`` seconds for a head call of ``m`` rows, fitted to measured calls (least squares over the row
    counts seen, each at the median of its last ``keep`` calls, weighted by its calls; ``a, s >= 0``)."""

    def __init__(self, keep: int = 9):
        self.keep = keep
        self.seconds: dict[int, deque] = defaultdict(lambda: deque(maxlen=self.keep))

    def observe(self, rows: int, seconds: float) -> None:
        self.seconds[int(rows)].append(float(seconds))

    def fit(self) -> tuple[float, float] | None:
        """``(a, s)``, or ``None`` before two row counts have been measured."""
        if len(self.seconds) < 2:
            return None
        points = [(m, median(ts), len(ts)) for m, ts in self.seconds.items()]
        w = sum(n for _, _, n in points)
        mean_m = sum(m * n for m, _, n in points) / w
        mean_t = sum(t * n for _, t, n in points) / w
        var = sum(n * (m - mean_m) ** 2 for m, _, n in points)
        s = sum(n * (m - mean_m) * (t - mean_t) for m, t, n in points) / var
        if s <= 0:                                         # no measurable cost per row: all fixed
            return mean_t, 0.0
        a = mean_t - s * mean_m
        if a < 0:                                          # no measurable fixed cost: all per row
            return 0.0, sum(t * n for _, t, n in points) / sum(m * n for m, _, n in points)
        return a, s


class BlockChooser:
    """The block for the next step (:attr:`block`): the session's ``initial`` block until measured, then the one
    whose replay over the last ``window`` steps costs least under the fitted :class:`CallCost`."""

    def __init__(self, initial: int, max_block: int = 16, window: int = 32, min_steps: int = 4):
        if int(initial) < 1 or int(max_block) < 1:
            raise ValueError(f"blocks must be >= 1, got initial={initial}, max_block={max_block}")
        self.initial, self.max_block, self.min_steps = int(initial), int(max_block), int(min_steps)
        self.cost = CallCost()
        self.steps: deque[tuple[int, int]] = deque(maxlen=window)
        self.block = self.initial
        self.chosen: list[int] = []                        # the block of each step (a run's record)

    def observe_call(self, rows: int, seconds: float) -> None:
        """One head call of ``rows`` rows took ``seconds``."""
        self.cost.observe(rows, seconds)

    def observe_step(self, read: int, rows: int) -> None:
        """A step's acceptance read ``read`` rows of a draft of ``rows`` rows (root included); sets :attr:`block`."""
        self.chosen.append(self.block)
        self.steps.append((max(int(read), 1), max(int(rows), 1)))
        fit = self.cost.fit()
        if fit is None or len(self.steps) < self.min_steps:
            return
        a, s = fit
        seen = Counter(self.steps)                          # (read, rows) pairs repeat: replay each once
        cost = {b: sum(n * replay_seconds(b, read, rows, a, s) for (read, rows), n in seen.items())
                for b in range(1, self.max_block + 1)}
        best = min(cost, key=cost.get)
        if cost[best] < cost[self.block] * (1 - 1e-9):     # blocks the replay cannot tell apart: keep the block
            self.block = best


__all__ = ["BlockChooser", "CallCost", "replay_seconds"]
