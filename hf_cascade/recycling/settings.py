"""Token Recycling's own settings (:class:`RecyclingSettings`), apart from the drafter that runs them."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..options import Options
from .candidates import RecyclingShape


@dataclass(frozen=True)
class RecyclingSettings(Options):
    """Token Recycling's candidates (Luo et al., 2024): how the tree is expanded, which repeats seed it and whether
    the table outlives a call. What is verified of the tree, on the running machine, is the assistant's
    :class:`~hf_cascade.options.Policy`.

    Attributes:
        shape: the candidate tree before the cost cut (:class:`RecyclingShape`: candidates kept per token, the
            paper's 8; most nodes expanded per step; deepest node).
        max_ngram / max_matches: longest suffix match whose continuations join the candidates, and how many of its
            most recent occurrences are counted (frequency-ranked; 1: Max-Gram's one continuation); ``max_ngram=0``,
            or ``Policy(lookup=False)``: none (the paper's table alone).
        hot_start: keep the recycled candidates across the calls of one assistant with one target (the paper's hot
            start; see :mod:`hf_cascade.recycling.drafter`; a different target, or
            :meth:`~hf_cascade.recycling.RecyclingAssistant.reset`, starts an empty table). Default: one table per
            call.
    """

    shape: RecyclingShape = field(default_factory=RecyclingShape)
    max_ngram: int = 8
    max_matches: int = 16
    hot_start: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.shape, RecyclingShape):
            raise TypeError(f"shape must be a RecyclingShape, got {type(self.shape).__name__}")
        if int(self.max_ngram) < 0 or int(self.max_matches) < 1:
            raise ValueError(
                f"RecyclingSettings needs max_ngram >= 0 and max_matches >= 1, got {self.max_ngram}, {self.max_matches}"
            )


__all__ = ["RecyclingSettings"]
