"""Which rows of a batched step draft, and whether any does: drafting must pay over the whole batch, on the
running machine.

Only the lagging rows (:func:`lagging_rows`) draft. A row ahead of them emits tokens the batch does not wait
for (they count only if it would later fall behind), while its draft costs its drafter's work and, in the
verification, head rows and possibly a wider forward; once it lags it drafts again. What follows is measured.

Each row's drafter sizes its own draft from its own acceptance and cost, but in a batch every row's
verification widens to the widest draft, and the batch ends only when its last row does: tokens a row
accepts beyond the others' shorten nothing while the forward costs about the same for fewer rows (a
memory-bound forward: a CPU at a few rows, a GPU far from its compute bound). So :class:`DraftGate`
measures, within one ``generate()`` call, the progress of the *lagging* rows (those with the most tokens
left to their length limit; the fewest tokens any of them emitted in the step) per second of step, on
steps where some row drafted and on plain steps (no row drafted), and lets the rows draft only while
drafting advances the lagging rows at least as fast. It starts by drafting, takes one plain step to
measure the other side, and while refusing drafts every ``explore_every``-th step anyway (acceptance
changes with the text). When drafting stops paying, and after each exploring step that does not pay, the
gate also narrows :attr:`DraftGate.width`, the most
nodes a row may verify in a drafted step (each row's draft keeps its first ``width`` nodes, a valid tree as
parents precede children), to at most half, and to its width times a plain step's time over its own: a wide
batched step can cost several plain ones, so exploring must get cheaper each time it fails; drafts that do
pay (above the plain rate) double it again. Not in any paper: it is the batch-level form of the rule the
single-row defaults already follow (draft only what pays for its verification, :mod:`hf_cascade.core.payoff.budget`,
:mod:`hf_cascade.core.payoff.rules`). A row that stops early (EOS) may make the measure pessimistic,
never wrong: outputs do not depend on it.

Where every lagging row's drafter estimates how far its draft will be accepted (:meth:`TreeDrafter.reach
<hf_cascade.core.strategy.TreeDrafter.reach>`), the gate instead sizes each step's drafts by expectation
(:meth:`DraftGate.width_for`): the lagging rows draft at every step, and every draft is cut to the width ``w``
that maximises the expected fewest tokens a lagging row emits per second of step,
``(1 + sum_k prod_b P_b(>= k)) / t(w)`` (rows accept independently; ``t(w)``, the step's time with ``w`` nodes
per row at this many rows, measured in this call, :class:`~hf_cascade.core.payoff.cost.CostModel`'s prior
until measured), ``w = 0`` (no draft) when a plain step is faster. It is the batch-level form of Max-Gram's
adaptive lookahead: per step, from the drafts' own evidence, where the rule above only knows the past steps'
outcomes; in a batch of rows tied at the end, a draft pays only where every tied row's draft is likely
accepted, which the estimates tell apart step by step.

The times are host wall times of whole steps (draft, verify, accept, update), each ending after acceptance
read the device, so the device is synchronised. Decisions depend on past timings only, never on random
draws: greedy outputs stay exact and sampling stays lossless whatever the gate decides.
"""

from __future__ import annotations

import time

import torch

from .cost import CostModel


class DraftGate:
    """Per call: drafted vs plain progress of a batch's lagging rows (see the module docstring).

    ``explore_every``: refused steps between two drafted ones while plain steps are faster; each exploring
    step that still measures drafting slower doubles the interval and narrows :attr:`width` (an exploring
    step can cost several plain ones), one that pays sets the interval back; a drafted step faster than the
    plain rate doubles :attr:`width`."""

    #: only the lagging rows draft (the module docstring); ``False``: every row does
    follows_lagging: bool = True
    #: size drafts by the drafters' estimates where every lagging row gives them (:meth:`width_for`)
    by_estimate: bool = True
    #: rows ahead draft into the padded width where their drafts cost at most this share of a step
    #: (:meth:`rides`); 0: they never do
    ride_share: float = 0.05

    def __init__(self, explore_every: int = 8, decay: float = 0.7):
        self.explore_every, self.decay = int(explore_every), float(decay)
        self.rate: dict[bool, float | None] = {True: None, False: None}  # lagging rows' tokens / second, EMA
        self.interval = self.explore_every
        self.refused = 0
        self.exploring = False
        #: the most nodes a row may verify in a drafted step (``None``: as its drafter proposes)
        self.width: int | None = None
        self.drafting = True  # drafts allowed by the comparison (not exploring)
        self.last: tuple[int, float] | None = None  # the last drafted step: widest draft, seconds
        #: the last step's lagging rows all estimated their drafts' reach: :meth:`width_for` sizes the drafts
        self.estimated = False
        self.costs: dict[int, CostModel] = {}  # rows -> step time by widest draft (nodes)
        self.last_step: float | None = None  # the last step's wall time (seconds)
        self.idle_interval = 0  # > 0: sized drafts were cut to nothing (sized_to)
        self.idle_skipped = 0

    def allows(self) -> bool:
        """Whether the rows may draft at this step."""
        if self.by_estimate and self.estimated:  # the drafts are sized after drafting (width_for),
            if not self.idle_interval:  # unless costly drafts were cut to nothing (sized_to)
                return True
            self.idle_skipped += 1
            if self.idle_skipped >= self.idle_interval:
                self.idle_skipped = 0
                return True
            return False
        drafted, plain = self.rate[True], self.rate[False]
        if drafted is None:
            return True  # start by drafting
        if plain is None:
            return False  # then measure one plain step
        if drafted >= plain:
            self.drafting = True
            return True
        if self.drafting:  # drafting stops paying: narrow the next drafts
            self.drafting = False
            self._narrow()
        self.refused += 1
        if self.explore_every > 0 and self.refused >= self.interval:
            self.refused, self.exploring = 0, True
            return True
        return False

    def width_for(self, reaches: list[list[float]], rows: int) -> int:
        """The draft width (nodes per row) with the most expected tokens of the slowest lagging row per second of
        step (module docstring), given each lagging row's ``reach`` (``P(at least k accepted)``, ``k = 1, ...``)
        at ``rows`` rows; 0: a plain step."""
        cost = self.costs.setdefault(rows, CostModel())
        best_w, best, expected = 0, 1.0, 1.0  # per plain step's time: a plain step emits 1
        for k in range(1, max((len(r) for r in reaches), default=0) + 1):
            joint = 1.0
            for r in reaches:
                joint *= r[k - 1] if k <= len(r) else 0.0
            if joint <= 0.0:
                break
            expected += joint
            value = expected / cost.cost(k)
            if value > best:
                best_w, best = k, value
        return best_w

    def rides(self, row, width: int) -> bool:
        """Whether ``row`` (a :class:`~hf_cascade.core.phases.Row`), ahead of the lagging rows, drafts into the step's
        padded width (``width`` nodes, set by the lagging rows' drafts). Every row's verification is ``width + 1``
        queries wide anyway (the batch's block is rectangular), so its nodes cost the forward nothing: only its
        drafter's work, and head rows for what it accepts. A row ahead gains tokens that shorten nothing now, but it
        finishes sooner, after which the batch's steps have fewer rows; and a row that later lags has less left. So
        it rides along only where its drafts are cheap: its drafter reads no copy of the target's cache (a gather
        per layer), and its own drafts took at most :attr:`ride_share` of a step's time (``row.draft_seconds``,
        measured on this row; unmeasured rows ride once, to be measured)."""
        if width <= 0 or not self.ride_share or getattr(row.drafter, "reads_target_cache", False):
            return False
        step = self.last_step
        return row.draft_seconds is None or step is None or row.draft_seconds <= self.ride_share * step

    def sized(self, drafts: dict[int, tuple], rows, started: float | None = None) -> dict[int, tuple]:
        """The drafting rows' drafts (row index -> draft, made since ``started``; ``rows``: the batch's
        :class:`~hf_cascade.core.phases.Row` list) cut to the expected-gain width where every one of them estimates
        its draft's reach (:meth:`width_for`; the gate learns what drafting cut to nothing cost, :meth:`sized_to`);
        as drafted otherwise (the rate rule of :meth:`allows` applies)."""
        reaches = [rows[b].drafter.reach(tree) for b, (tree, _) in drafts.items()] if self.by_estimate else [None]
        self.estimated = bool(reaches) and all(r is not None for r in reaches)
        if not self.estimated or not any(tree.num_nodes for tree, _ in drafts.values()):
            return drafts
        width = self.width_for(reaches, len(rows))
        if started is not None:
            self.sized_to(width, time.perf_counter() - started)
        return {b: self.cut(tree, q, width) for b, (tree, q) in drafts.items()}

    def sized_to(self, width: int, drafting_seconds: float) -> None:
        """After :meth:`width_for` chose ``width`` for drafts that took ``drafting_seconds`` to make. Drafts cut to
        nothing were wasted work; where that work cost more than :attr:`ride_share` of a step (a neural drafter's
        forwards, not a lookup), the next steps do not draft, except every ``explore_every``-th, and twice as
        rarely after each that is cut to nothing again (at most every 16th); a width above 0 drafts at every step
        again. Drafts that cheap are always made: each step's estimate decides, at no cost."""
        if width > 0:
            self.idle_interval = self.idle_skipped = 0
        elif self.last_step is not None and drafting_seconds > self.ride_share * self.last_step:
            self.idle_interval = min(2 * self.idle_interval, 16) if self.idle_interval else self.explore_every
            self.idle_skipped = 0

    def observe(self, drafted: bool, tokens: int, seconds: float, widest: int = 0, rows: int | None = None) -> None:
        """One step: whether any row drafted, the tokens the lagging rows emitted (the fewest of them), its
        wall time, the widest row's draft (nodes) and the rows verified."""
        if seconds <= 0:
            return
        self.last_step = seconds
        if rows is not None:
            self.costs.setdefault(rows, CostModel()).observe(widest if drafted else 0, seconds)
        rate = tokens / seconds
        old = self.rate[drafted]
        self.rate[drafted] = rate if old is None else self.decay * old + (1 - self.decay) * rate
        if not drafted:
            return
        self.last = (widest, seconds)
        plain = self.rate[False]
        if self.width is not None and plain is not None and rate >= plain:
            self.width *= 2  # drafts that pay may widen again
        if self.exploring:
            self.exploring = False
            if self.rate[True] < self.rate[False]:
                self.interval *= 2
                self._narrow()
            else:
                self.interval = self.explore_every

    def cut(self, tree, q, width: int | None = None):
        """A row's draft (``tree``, draw probabilities ``q`` or ``None``) cut to its first ``width`` nodes (default
        :attr:`width`; a valid tree: parents precede children; the mask is built on the host, no device read)."""
        width = self.width if width is None else width
        if width is None or tree.num_nodes <= width:
            return tree, q
        keep = torch.arange(tree.num_nodes) < width
        return tree.select(keep), (q[:width] if q is not None else None)

    def _narrow(self) -> None:
        """After a drafted step that did not pay: at most half as wide as it was, and narrower still in
        proportion to what it cost over a plain step (a plain step advances the lagging rows one token)."""
        plain = self.rate[False]
        if self.last is None or not plain:
            return
        widest, seconds = self.last
        widest = min(widest, self.width or widest)
        self.width = max(1, min(widest // 2, int(widest / (plain * seconds))))


def lagging_rows(left: list[int]) -> list[int]:
    """The rows with the most tokens ``left`` to their length limit: the batch ends when they do."""
    most = max(left)
    return [b for b, n in enumerate(left) if n == most]


__all__ = ["DraftGate", "lagging_rows"]
