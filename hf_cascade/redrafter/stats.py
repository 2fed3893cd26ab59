"""Statistics of one ReDrafter ``generate()`` call: :class:`ReDrafterStats` (a ``GenerationStats``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.stats import TreeStats


@dataclass
class ReDrafterStats(TreeStats):
    """:class:`~hf_cascade.core.strategy.TreeStats` of one ``generate()`` call, plus the beams.

    Attributes:
        beam_tokens: ``w' * L'`` tokens the beam search proposed at each drafted step (``L'`` = the
            beam length cut to the remaining length budget).
        drafted_nodes: nodes of the packed tree built from them (before confidence pruning and
            before the loop pruned nodes below an EOS): ``beam_tokens`` with ``dedupe=False``.
        confident_nodes: nodes left after ``min_confidence`` pruning (= ``drafted_nodes`` when it is 0).
        skipped_drafts: steps that drafted nothing (no hidden state yet, or no length budget left).
        draft_forwards: forwards of the head: one per beam-search step (a recurrent step and the logits
            of every live beam), ``L'`` per drafted step.
        draft_tokens: rows those forwards ran (the live beams of each step,
            :func:`~hf_cascade.redrafter.beam.beam_rows`).

    ``levels`` holds one :class:`~hf_cascade.core.stats.LevelStats` named ``"redrafter"`` with these forwards.
    """

    beam_tokens: list[int] = field(default_factory=list)
    drafted_nodes: list[int] = field(default_factory=list)
    confident_nodes: list[int] = field(default_factory=list)
    skipped_drafts: int = 0
    draft_forwards: int = 0
    draft_tokens: int = 0

    @property
    def compression_ratio(self) -> float:
        """Beam tokens per node of the packed tree, before confidence pruning (the paper's Figure 5b; 1.0
        without dedupe)."""
        nodes = sum(self.drafted_nodes)
        return sum(self.beam_tokens) / nodes if nodes else 1.0

    @property
    def draft_cost_ratio(self) -> float:
        """Drafting time over verification time: the cost of one draft (beam search + packing) as a
        fraction of one target forward over the tree (both are done once per step)."""
        verify = self.phase_seconds.get("verify", 0.0)
        return self.phase_seconds.get("draft", 0.0) / verify if verify else 0.0

    def to_dict(self) -> dict:
        out = super().to_dict()
        out.update(
            {
                "beam_tokens": list(self.beam_tokens),
                "drafted_nodes": list(self.drafted_nodes),
                "confident_nodes": list(self.confident_nodes),
                "skipped_drafts": self.skipped_drafts,
                "draft_forwards": self.draft_forwards,
                "draft_tokens": self.draft_tokens,
                "compression_ratio": self.compression_ratio,
                "draft_cost_ratio": self.draft_cost_ratio,
            }
        )
        return out


__all__ = ["ReDrafterStats"]
