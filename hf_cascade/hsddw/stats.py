"""Statistics of one HSDDW ``generate()`` call: :class:`DynamicWindowStats` (a ``GenerationStats``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.stats import GenerationStats


@dataclass
class DynamicWindowStats(GenerationStats):
    """``GenerationStats`` plus what HSDDW's analysis (§4.4, Table 4, Figure 8) looks at.

    ``levels`` are top first: ``[verifier, draft]`` with a pre-verifier, else ``[draft]``, then
    ``maxgram`` when the Max-Gram lookup is on (``lookup``); each level's ``tokens_accepted`` counts
    acceptance by the model directly above it (the lookup's: by the target, to which it drafts directly).
    A target step is drafted either by the lookup (its level records the step) or by the draft models.

    Attributes:
        draft_windows: tokens the small draft model drafted in each Draft + Self-verify stage.
        tau_trajectory: the small draft model's ``tau`` in effect at each of those stages.
        tau2_trajectory: the pre-verifier's ``tau2`` in effect at each target step the draft models drafted
            (empty without a pre-verifier; lookup steps add nothing).
        rejected_entropies: ``H(q)`` of the small model's rejected tokens (its ``tau`` is their mean).
        rejected_entropies2: ``H(q)`` of the pre-verifier's tokens the target rejected (``tau2``'s mean).
        lookup: whether the last level is the Max-Gram lookup's (a statistical level: no forwards).
        plain_steps: target steps with no draft because the draft models were not expected to pay
            (``Policy.cost_aware``).
    """

    draft_windows: list[int] = field(default_factory=list)
    tau_trajectory: list[float] = field(default_factory=list)
    tau2_trajectory: list[float] = field(default_factory=list)
    rejected_entropies: list[float] = field(default_factory=list)
    rejected_entropies2: list[float] = field(default_factory=list)
    lookup: bool = False
    plain_steps: int = 0

    @property
    def window_per_step(self) -> list[int]:
        """Tokens handed to the target at each verification step (the window of Figure 8): one entry per
        target call, lookup steps included (``draft_windows`` has the draft model's stages only)."""
        return list(self.draft_len_per_call)

    @property
    def redundancy(self) -> float:
        """sigma (§4.4) = 1 - accepted / drafted tokens, over the tokens handed to the target (as the
        authors' ``redundency.py``: ``sum(accepted_num) / sum(gamma_sequence)``), lookup tokens included."""
        drafted = sum(self.draft_len_per_call)
        return 1.0 - sum(self.accepted_per_call) / drafted if drafted else 0.0

    @property
    def target_utilization(self) -> float:
        """eta (§4.4) = target model inferences / final output length."""
        return self.target_calls / self.new_tokens if self.new_tokens else 0.0

    @property
    def calls_per_model(self) -> dict[str, int]:
        """Forward passes per model: ``{"target": ..., "verifier": ..., "draft": ...}``; the lookup's level
        (the last one when ``lookup``) runs no model and is left out, so the roles follow the model levels."""
        models = self.levels[:-1] if self.lookup else self.levels
        roles = ["draft"] if len(models) == 1 else ["verifier", "draft"]
        return {"target": self.target_calls, **{r: lv.forward_calls for r, lv in zip(roles, models)}}

    def to_dict(self) -> dict:
        out = super().to_dict()
        out.update(
            {
                "window_per_step": self.window_per_step,
                "draft_windows": list(self.draft_windows),
                "tau_trajectory": list(self.tau_trajectory),
                "tau2_trajectory": list(self.tau2_trajectory),
                "rejected_entropies": list(self.rejected_entropies),
                "rejected_entropies2": list(self.rejected_entropies2),
                "redundancy": self.redundancy,
                "target_utilization": self.target_utilization,
                "calls_per_model": self.calls_per_model,
                "plain_steps": self.plain_steps,
            }
        )
        return out
