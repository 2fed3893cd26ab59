"""Statistics returned as data after each ``generate()`` call.

Every strategy fills one :class:`GenerationStats`; nothing is printed by library code.
Read it from ``assistant.last_stats`` after ``model.generate(..., assistant_model=assistant)``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field


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
    forward_calls: int = 0          # neural forward passes (0 for statistical drafters)
    proposals: int = 0              # times this level proposed tokens to its reviewer
    tokens_proposed: int = 0
    tokens_accepted: int = 0        # accepted by the level directly above it
    acceptance_by_position: PositionCounts = field(default_factory=PositionCounts)


@dataclass
class GenerationStats:
    """Statistics of one ``generate()`` call.

    Attributes:
        target_calls: verification forward passes of the target.
        accepted_per_call: draft tokens accepted by the target at each call (the bonus token excluded).
        draft_len_per_call: draft tokens proposed to the target at each call.
        acceptance_by_position: acceptance at the target by draft position (Figure 2 of CS Drafting).
        levels: per-drafter statistics, top (largest) drafter first.
        phase_seconds: wall time per phase, e.g. ``{"draft": .., "verify": ..}``.
        head_rows_requested / head_rows_computed: rows of target logits that multi-row verification
            forwards asked for, and those the output head computed (:mod:`hf_cascade.verify_head`
            skips rows greedy acceptance never reads).
    """

    target_calls: int = 0
    accepted_per_call: list[int] = field(default_factory=list)
    draft_len_per_call: list[int] = field(default_factory=list)
    acceptance_by_position: PositionCounts = field(default_factory=PositionCounts)
    levels: list[LevelStats] = field(default_factory=list)
    phase_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    head_rows_requested: int = 0
    head_rows_computed: int = 0

    @property
    def new_tokens(self) -> int:
        """Tokens produced through the assisted loop (accepted drafts plus one target token per call)."""
        return sum(self.accepted_per_call) + self.target_calls

    @property
    def tokens_per_target_call(self) -> float:
        """Mean tokens produced per target forward (1.0 means no speculation gain)."""
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    def record_target_review(self, num_proposed: int, num_accepted: int) -> None:
        self.target_calls += 1
        self.draft_len_per_call.append(num_proposed)
        self.accepted_per_call.append(num_accepted)
        self.acceptance_by_position.record(num_proposed, num_accepted)

    def to_dict(self) -> dict:
        return {
            "target_calls": self.target_calls,
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
            "head_rows_requested": self.head_rows_requested,
            "head_rows_computed": self.head_rows_computed,
        }


class PhaseTimer:
    """``with timer("draft"): ...`` adds the elapsed wall time to ``stats.phase_seconds["draft"]``."""

    def __init__(self, stats: GenerationStats):
        self._stats = stats

    def __call__(self, phase: str) -> "_Phase":
        return _Phase(self._stats, phase)


class _Phase:
    def __init__(self, stats: GenerationStats, phase: str):
        self._stats, self._phase = stats, phase

    def __enter__(self) -> None:
        self._t0 = time.perf_counter()

    def __exit__(self, *exc) -> None:
        self._stats.phase_seconds[self._phase] += time.perf_counter() - self._t0
