"""The cascade's own settings (:class:`CascadeSettings`), apart from the candidate generator that runs them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..options import Options


@dataclass(frozen=True)
class CascadeSettings(Options):
    """Cascade Speculative Drafting's settings (Chen et al., 2024). What is drafted beyond them on the running
    machine (the drafter's tokens admitted where they pay, Max-Gram's match first) is the assistant's
    :class:`~hf_cascade.options.Policy`.

    Attributes:
        k_matrix: ``n x n`` upper-triangular draft counts, one row and column per drafter (see
            :mod:`hf_cascade.cascade.k_matrix`); ``None``: the paper's ``[[2, 10], [0, 10]]`` pattern for the
            assistant's drafters.
        lenience: ``>= 1``; loosens reviews *between drafters* only (never the target's), so the output
            distribution is unchanged (§3.1).
        maxgram_lenience: ``>= 1``; lenience of a neural drafter's review of Max-Gram tokens (accepts a Max-Gram
            token when ``maxgram_lenience * p_drafter(token) >= 1``, under sampling with probability
            ``min(1, maxgram_lenience * p)``). Default 1 = none, as in the paper's App. B. Deviation: a small
            distilled drafter that is right on a minority of out-of-domain tokens (``docs/design.md``) vetoes many
            correct Max-Gram continuations; ``float("inf")`` lets Max-Gram's matches through unreviewed. Lossless
            at the target either way.
        min_confidence: a neural drafter stops contributing to the current draft after a token it gave probability
            ``< min_confidence`` (0 = never; transformers' assistants use 0.4 the same way). Stop rules that only
            look at drawn tokens keep sampling lossless.
        keep_unsure: with ``min_confidence``, whether the unsure token itself stays in the draft (``True``,
            transformers' behaviour) or is dropped (``False``: the target then verifies only tokens the drafter was
            confident of, so when Max-Gram has no match and the drafter is unsure, the target runs a cheap one-token
            step). Lossless either way: under sampling a kept token's ``q`` is the drafter's distribution
            restricted to tokens at or above the floor.
    """

    k_matrix: Sequence[Sequence[int]] | None = None
    lenience: float = 1.0
    maxgram_lenience: float = 1.0
    min_confidence: float = 0.0
    keep_unsure: bool = True

    def __post_init__(self) -> None:
        if self.k_matrix is not None:  # a tuple of rows: the settings stay immutable
            object.__setattr__(self, "k_matrix", tuple(tuple(row) for row in self.k_matrix))
        if self.lenience < 1.0 or self.maxgram_lenience < 1.0:
            raise ValueError(
                f"lenience and maxgram_lenience must be >= 1, got {self.lenience}, {self.maxgram_lenience}."
            )
        if not 0.0 <= self.min_confidence <= 1.0:
            raise ValueError(f"min_confidence must be in [0, 1], got {self.min_confidence}.")
        self._normalize(lenience=float, maxgram_lenience=float, min_confidence=float, keep_unsure=bool)


__all__ = ["CascadeSettings"]
