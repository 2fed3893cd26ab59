"""Statistics of one GLIDE ``generate()`` call: :class:`GlideStats` (a ``GenerationStats``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.stats import TreeStats


@dataclass
class GlideStats(TreeStats):
    """:class:`~hf_cascade.core.stats.GenerationStats` of one ``generate()`` call, plus GLIDE's own numbers.

    Attributes:
        draft_forwards: forward calls of the draft model.
        draft_tokens: tokens run through the draft (catch-up tokens included).
        main_lengths: main-path tokens drafted at each drafted step (0: ``min_confidence`` stopped the path
            at its first token, for CAPE below ``min_expansion_prob``).
        expansion_sizes: ``|X_i|`` of each main token at each drafted step (empty lists without CAPE).
        confidences: the draft's ``p_i = max p_D`` of each main token at each drafted step.
        main_accepted: accepted tokens that lie on the main path, per verification.
        expansion_accepted: verifications whose accepted path ends with an expansion token.
        skipped_drafts: steps that drafted nothing (no length budget left).
        drafted_nodes: tree nodes drafted at each drafted step, before the cost rule chose what to verify
            (``tree_sizes`` holds the verified ones).
        drawn_drafts: drafted steps whose main path was drawn from ``q`` (sampling only,
            :mod:`hf_cascade.core.draws`); the others took the argmax.
    """

    draft_forwards: int = 0
    draft_tokens: int = 0
    main_lengths: list[int] = field(default_factory=list)
    expansion_sizes: list[list[int]] = field(default_factory=list)
    confidences: list[list[float]] = field(default_factory=list)
    main_accepted: list[int] = field(default_factory=list)
    expansion_accepted: int = 0
    skipped_drafts: int = 0
    drafted_nodes: list[int] = field(default_factory=list)
    drawn_drafts: int = 0

    @property
    def draft_cost_ratio(self) -> float:
        """Drafting time over verification time (both once per step)."""
        verify = self.phase_seconds.get("verify", 0.0)
        return self.phase_seconds.get("draft", 0.0) / verify if verify else 0.0

    @property
    def draft_forward_cost(self) -> float:
        """The paper's cost coefficient ``c``: time of one draft forward over that of one target forward
        (a verification over the tree)."""
        verify = self.phase_seconds.get("verify", 0.0)
        if not (verify and self.draft_forwards and self.target_calls):
            return 0.0
        return (self.phase_seconds.get("draft", 0.0) / self.draft_forwards) / (verify / self.target_calls)

    def to_dict(self) -> dict:
        out = super().to_dict()
        out.update(
            {
                k: getattr(self, k)
                for k in (
                    "draft_forwards",
                    "draft_tokens",
                    "main_lengths",
                    "expansion_sizes",
                    "confidences",
                    "main_accepted",
                    "expansion_accepted",
                    "skipped_drafts",
                    "drafted_nodes",
                    "drawn_drafts",
                    "draft_cost_ratio",
                    "draft_forward_cost",
                )
            }
        )
        return out


_RECORDED = (
    "draft_forwards",
    "draft_tokens",
    "main_lengths",
    "expansion_sizes",
    "confidences",
    "main_accepted",
    "expansion_accepted",
    "skipped_drafts",
    "drafted_nodes",
    "drawn_drafts",
)
