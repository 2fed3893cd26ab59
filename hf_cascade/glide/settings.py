"""GLIDE's method settings (:class:`GlideSettings`), apart from the drafter that runs them."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.payoff import VerifyCost
from .cape import CapeSettings


@dataclass(frozen=True)
class GlideSettings:
    """``draft_length``: main-path tokens per step (``gamma``; the paper evaluates GLIDE with 5);
    ``cape``: the expansion function, ``None`` = no expansion (a chain); ``min_confidence``: the main path
    stops at the first token the draft gives probability ``< min_confidence`` (0 = never, the paper's fixed
    ``gamma``). A chain does not verify that unsure token; with CAPE it is verified with its expansion set,
    the position where siblings are most likely to be needed, if its path probability (its ``p`` times the
    main confidences above it) reaches CAPE's ``min_prob``, the floor of the siblings. ``verify_cost``: verify
    only the drafted nodes that pay for their verification on this hardware (:mod:`hf_cascade.core.payoff`);
    ``None`` = everything drafted (the paper). ``lookup``: with ``verify_cost``, the sequence's repeats join the
    tree as a branch (:mod:`hf_cascade.drafters.lookup_branch`; not in the paper)."""

    draft_length: int = 5
    cape: CapeSettings | None = field(default_factory=CapeSettings)
    min_confidence: float = 0.0
    verify_cost: VerifyCost | None = None
    lookup: bool = False

    def __post_init__(self) -> None:
        if int(self.draft_length) < 1:
            raise ValueError(f"draft_length must be >= 1, got {self.draft_length}")
        if not 0.0 <= float(self.min_confidence) <= 1.0:
            raise ValueError(f"min_confidence must be in [0, 1], got {self.min_confidence}")


__all__ = ["GlideSettings"]
