"""Statistics returned as data after each ``generate()`` call.

Every strategy fills one :class:`GenerationStats` (or a subclass with its own fields); nothing is
printed by library code.
Read it from ``assistant.last_stats`` after ``model.generate(..., assistant_model=assistant)``.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections import defaultdict
from dataclasses import dataclass, field

from .. import placement


@dataclass
class PositionCounts:
    """Acceptance by draft position: ``proposed[i]`` drafts sat at position ``i`` of a review,
    ``accepted[i]`` of them were accepted by the reviewer."""

    proposed: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)

    def record(self, num_proposed: int, num_accepted: int) -> None:
        """One review of ``num_proposed`` drafts of which the first ``num_accepted`` were accepted."""
        if num_proposed > len(self.proposed):
            grow = num_proposed - len(self.proposed)
            self.proposed += [0] * grow
            self.accepted += [0] * grow
        for i in range(num_proposed):
            self.proposed[i] += 1
            self.accepted[i] += int(i < num_accepted)

    def rates(self) -> list[float]:
        """Acceptance rate by position (``accepted / proposed``)."""
        return [a / p if p else 0.0 for a, p in zip(self.accepted, self.proposed)]


@dataclass
class LevelStats:
    """One drafter of a cascade (or the single drafter of a strategy)."""

    name: str
    forward_calls: int = 0  # neural forward passes (0 for statistical drafters)
    forward_tokens: int = 0  # tokens (rows) those forwards ran, catch-up tokens and beams included
    proposals: int = 0  # times this level proposed tokens to its reviewer
    tokens_proposed: int = 0
    tokens_accepted: int = 0  # accepted by the level directly above it
    acceptance_by_position: PositionCounts = field(default_factory=PositionCounts)


@dataclass
class GenerationStats:
    """Statistics of one ``generate()`` call, filled by the decoding core (:mod:`hf_cascade.core.loop`)
    and by the strategy (its levels).

    A linear draft is a tree with one path, so the same fields describe every strategy.
    ``target_calls`` counts verifications (each emits ``accepted + 1`` tokens; the prompt's prefill
    emits none and is timed in ``phase_seconds["prefill"]``); ``prefill_calls`` counts the target forwards
    over the prompt alone that emit nothing (1 in the decoding core for a prompt of two tokens or more; 0 in
    transformers' assisted loop, whose first verification runs the prompt too), so the target ran
    ``prefill_calls + target_calls`` forwards.

    Attributes:
        target_calls: verification forward passes of the target.
        prefill_calls: target forwards over the prompt that verified nothing (see above).
        accepted_per_call: draft tokens accepted by the target at each call (the bonus token excluded).
        draft_len_per_call: draft tokens (tree nodes) proposed to the target at each call.
        acceptance_by_position: acceptance at the target by draft position (*depth* for trees: position
            ``i`` counts drafts deeper than ``i`` and accepted paths longer than ``i``; Figure 2 of CS Drafting).
        levels: per-drafter statistics, top (largest) drafter first.
        phase_seconds: wall time per phase of the loop: ``prefill``, ``draft``, ``verify``, ``accept``,
            ``update``, and a strategy's own (e.g. ``review[0]``). On an accelerator, each phase's own device work
            only with ``Policy(sync_phases=True)`` (:class:`PhaseTimer`); by default a phase's host time, device
            work charged to the phase that next reads the device.
        tree_depths / tree_leaves: depth and leaves of each verified draft (a chain: its length, 1).
        accepted_paths: accepted node indices per call (before an EOS / ``max_length`` cut).
        head_rows: rows of logits the target's output head computed per call (of the ``n + 1``
            verified; acceptance reads only some, see :mod:`hf_cascade.core.rows`); ``head_calls``: the
            output-head calls per target call.
    """

    target_calls: int = 0
    prefill_calls: int = 0
    accepted_per_call: list[int] = field(default_factory=list)
    draft_len_per_call: list[int] = field(default_factory=list)
    acceptance_by_position: PositionCounts = field(default_factory=PositionCounts)
    levels: list[LevelStats] = field(default_factory=list)
    phase_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    tree_depths: list[int] = field(default_factory=list)
    tree_leaves: list[int] = field(default_factory=list)
    accepted_paths: list[list[int]] = field(default_factory=list)
    head_rows: list[int] = field(default_factory=list)
    head_calls: list[int] = field(default_factory=list)

    @property
    def new_tokens(self) -> int:
        """Tokens produced by verifications (accepted drafts plus one target token per call)."""
        return sum(self.accepted_per_call) + self.target_calls

    @property
    def tokens_per_target_call(self) -> float:
        """Mean tokens produced per target forward (1.0 means no speculation gain)."""
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def tree_sizes(self) -> list[int]:
        return list(self.draft_len_per_call)

    @property
    def accepted_length_per_step(self) -> list[int]:
        return list(self.accepted_per_call)

    @property
    def head_rows_computed(self) -> int:
        return sum(self.head_rows)

    def record_target_review(self, num_proposed: int, num_accepted: int) -> None:
        """One verification of a linear draft of ``num_proposed`` tokens, ``num_accepted`` accepted
        (transformers' assisted loop: no row counts)."""
        self.target_calls += 1
        self.draft_len_per_call.append(num_proposed)
        self.accepted_per_call.append(num_accepted)
        self.acceptance_by_position.record(num_proposed, num_accepted)
        self.tree_depths.append(num_proposed)
        self.tree_leaves.append(1 if num_proposed else 0)

    def record_step(
        self,
        num_nodes: int,
        depth: int,
        leaves: int,
        path: list[int],
        emitted: int,
        head_rows: int | None = None,
        head_calls: int = 1,
    ) -> None:
        """One verification of an ``num_nodes``-node draft that emitted ``emitted`` tokens (``>= 1``)
        along ``path``, for which the output head computed ``head_rows`` rows (default: all
        ``n + 1``) in ``head_calls`` calls. Host values only (no device reads)."""
        self.target_calls += 1
        self.accepted_per_call.append(emitted - 1)
        self.draft_len_per_call.append(num_nodes)
        self.acceptance_by_position.record(depth, emitted - 1)
        self.tree_depths.append(depth)
        self.tree_leaves.append(leaves)
        self.accepted_paths.append(list(path))
        self.head_rows.append(num_nodes + 1 if head_rows is None else int(head_rows))
        self.head_calls.append(int(head_calls))

    def to_dict(self) -> dict:
        return {
            "target_calls": self.target_calls,
            "prefill_calls": self.prefill_calls,
            "new_tokens": self.new_tokens,
            "tokens_per_target_call": self.tokens_per_target_call,
            "accepted_per_call": list(self.accepted_per_call),
            "draft_len_per_call": list(self.draft_len_per_call),
            "acceptance_by_position": {
                "proposed": list(self.acceptance_by_position.proposed),
                "accepted": list(self.acceptance_by_position.accepted),
            },
            "levels": [
                {
                    "name": lv.name,
                    "forward_calls": lv.forward_calls,
                    "forward_tokens": lv.forward_tokens,
                    "proposals": lv.proposals,
                    "tokens_proposed": lv.tokens_proposed,
                    "tokens_accepted": lv.tokens_accepted,
                    "acceptance_by_position": {
                        "proposed": list(lv.acceptance_by_position.proposed),
                        "accepted": list(lv.acceptance_by_position.accepted),
                    },
                }
                for lv in self.levels
            ],
            "phase_seconds": dict(self.phase_seconds),
            "tree_sizes": self.tree_sizes,
            "tree_depths": list(self.tree_depths),
            "tree_leaves": list(self.tree_leaves),
            "accepted_paths": [list(p) for p in self.accepted_paths],
            "head_rows": list(self.head_rows),
            "head_calls": list(self.head_calls),
        }


#: Former name of the statistics of tree strategies: every strategy now fills the same fields.
TreeStats = GenerationStats


@dataclass
class BatchStats:
    """Statistics of one batched ``generate()`` call (:mod:`hf_cascade.core.batch`): one
    :class:`GenerationStats` per row (``rows[b]``, filled by row ``b``'s drafter and steps; its
    ``target_calls`` counts the verifications row ``b`` took part in), and the batch's own forwards.

    Attributes:
        target_calls: batched verification forwards; ``rows_per_call`` / ``width_per_call``: the rows in
            each and the columns per row (the widest draft plus its root).
        compactions: times the cache's rows were gathered to drop padding and holes.
    """

    rows: list[GenerationStats] = field(default_factory=list)
    target_calls: int = 0
    prefill_calls: int = 0
    rows_per_call: list[int] = field(default_factory=list)
    width_per_call: list[int] = field(default_factory=list)
    compactions: int = 0
    phase_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def record_forward(self, rows: int, width: int) -> None:
        self.target_calls += 1
        self.rows_per_call.append(int(rows))
        self.width_per_call.append(int(width))

    @property
    def new_tokens(self) -> int:
        return sum(r.new_tokens for r in self.rows)

    @property
    def tokens_per_target_call(self) -> float:
        """Tokens emitted over the batch per batched target forward (``B`` means no speculation gain
        while every row runs)."""
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    def to_dict(self) -> dict:
        return {
            "target_calls": self.target_calls,
            "prefill_calls": self.prefill_calls,
            "new_tokens": self.new_tokens,
            "tokens_per_target_call": self.tokens_per_target_call,
            "rows_per_call": list(self.rows_per_call),
            "width_per_call": list(self.width_per_call),
            "compactions": self.compactions,
            "phase_seconds": dict(self.phase_seconds),
            "rows": [r.to_dict() for r in self.rows],
        }


#: Whether the phase timers built now wait for the accelerators at each phase's edges (:class:`PhaseTimer`); set for a
#: block of code with :func:`synchronized_phases`.
_SYNC_PHASES: contextvars.ContextVar[bool] = contextvars.ContextVar("hf_cascade_sync_phases", default=False)


@contextlib.contextmanager
def synchronized_phases(on: bool = True):
    """Inside the block, the :class:`PhaseTimer` s built (one per ``generate()`` call) synchronise the target's
    accelerators at each phase's edges, so that ``phase_seconds`` charges each phase its own device work. What
    ``Policy(sync_phases=True)`` and ``hf-cascade bench --sync-phases`` set; off by default, where a phase's time is
    its host time up to the next device read."""
    token = _SYNC_PHASES.set(bool(on))
    try:
        yield
    finally:
        _SYNC_PHASES.reset(token)


class PhaseTimer:
    """``with timer("draft"): ...`` adds the elapsed wall time to ``stats.phase_seconds["draft"]``.

    The rule: a timing synchronises the device only where it is asked for, or where it decides something.
    ``phase_seconds`` decides nothing (the payoff rules read times that end with a host read, which waits for the
    device anyway: :attr:`~hf_cascade.core.strategy.TreeStep.verify_seconds`, or that synchronise themselves), so by
    default no phase waits for the device: on a GPU a phase is then timed up to its kernels' launch, and its device
    work is charged to whichever later phase reads the device (each synchronisation costs a host-device round trip,
    about eight per step otherwise). ``synchronize=True`` (default: :func:`synchronized_phases`' setting when the
    timer is built): where ``target`` runs on accelerators (:func:`~hf_cascade.placement.accelerators`), their queued
    work is waited for before each clock read (:func:`~hf_cascade.placement.synchronize`). On a CPU nothing is
    called either way."""

    def __init__(self, stats: GenerationStats, target=None, synchronize: bool | None = None):
        self._stats = stats
        synchronize = _SYNC_PHASES.get() if synchronize is None else bool(synchronize)
        self._devices = placement.accelerators(target) if synchronize and target is not None else ()

    @property
    def synchronizes(self) -> bool:
        """Whether the phases wait for an accelerator (asked for, and the target runs on one)."""
        return bool(self._devices)

    def __call__(self, phase: str) -> _Phase:
        return _Phase(self._stats, phase, self._devices)


class _Phase:
    def __init__(self, stats: GenerationStats, phase: str, devices: tuple = ()):
        self._stats, self._phase, self._devices = stats, phase, devices

    def _sync(self) -> None:
        for device in self._devices:
            placement.synchronize(device)

    def __enter__(self) -> None:
        if self._devices:
            self._sync()
        self._t0 = time.perf_counter()

    def __exit__(self, *exc) -> None:
        if self._devices:
            self._sync()
        self._stats.phase_seconds[self._phase] += time.perf_counter() - self._t0
