"""ReDrafter's own settings (:class:`ReDrafterSettings`): the shape of its beam search, apart from the drafter that
runs it."""

from __future__ import annotations

from dataclasses import dataclass

from ..options import Options


@dataclass(frozen=True)
class ReDrafterSettings(Options):
    """The shape of ReDrafter's draft (Cheng et al., 2024): a beam search of ``beam_width`` candidates of
    ``beam_length`` tokens, packed into a prefix tree. What is drafted and verified beyond that shape, on the
    running machine, is the assistant's :class:`~hf_cascade.options.Policy`.

    Attributes:
        beam_width: ``w``, candidates kept by the beam search (``1``: the head's greedy draft, a chain).
        beam_length: ``L``, draft tokens per candidate (the tree's depth; the reference's ``BeamShape.length`` is
            ``L + 1``, it counts the target's own first token).
        dedupe: verify the packed prefix tree (dynamic tree attention, the default) or, ``False``, the ``w * L``
            beam tokens flat, one branch per beam (same accepted tokens, more computation).
        min_confidence: drop every beam token whose conditional probability under the head is below this (and the
            rest of its beam); ``0``: no fixed floor. Not in the paper: for CPUs, where every verified token costs
            time; lossless (the tree is a function of the context).
    """

    beam_width: int = 4
    beam_length: int = 5
    dedupe: bool = True
    min_confidence: float = 0.0

    def __post_init__(self) -> None:
        if int(self.beam_width) < 1 or int(self.beam_length) < 1:
            raise ValueError(
                f"ReDrafter needs beam_width >= 1 and beam_length >= 1, got {self.beam_width} and {self.beam_length}"
            )
        if not 0.0 <= float(self.min_confidence) <= 1.0:
            raise ValueError(f"min_confidence must be in [0, 1], got {self.min_confidence}")
        self._normalize(beam_width=int, beam_length=int, dedupe=bool, min_confidence=float)


__all__ = ["ReDrafterSettings"]
