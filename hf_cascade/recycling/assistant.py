"""``generate(..., assistant_model=RecyclingAssistant())``: Token Recycling (Luo et al., 2024), no draft model; the
step itself is :class:`~hf_cascade.recycling.drafter.TokenRecycling`'s."""

from __future__ import annotations

from ..assistant import TreeAssistant
from ..core.payoff import DraftPolicy
from ..measure import bound_verify_cost
from ..options import Policy, rejects_moved
from .candidates import RecycledCandidates
from .drafter import TokenRecycling
from .settings import RecyclingSettings


class RecyclingAssistant(TreeAssistant):
    """``generate(..., assistant_model=RecyclingAssistant())``: Token Recycling, no draft model (see
    :mod:`hf_cascade.recycling.drafter`). Greedy output equals plain ``generate``; sampling is exact.

    Args:
        settings: the candidates (:class:`~hf_cascade.recycling.settings.RecyclingSettings`: the tree's
            :class:`~hf_cascade.recycling.candidates.RecyclingShape`, the repeats that seed it, ``hot_start``).
        policy: beyond the paper (:class:`~hf_cascade.options.Policy`): by default each step verifies only the
            candidates that pay for their rows (:class:`~hf_cascade.core.payoff.AdaptiveBudget`, with the
            verification profile measured on the target's device when the assistant binds) and the sequence's
            repeats seed the tree; ``Policy.paper()``: the whole expanded tree of the table alone.
        cpu_kernels: see :mod:`hf_cascade.backends`.

    Example::

        from hf_cascade import RecyclingAssistant
        out = model.generate(ids, assistant_model=RecyclingAssistant(), do_sample=True, temperature=0.7)
    """

    @rejects_moved(
        RecyclingSettings,
        "max_ngram",
        "max_matches",
        "hot_start",
        policy=True,
        **{
            name: f"settings=RecyclingSettings(shape=RecyclingShape({name}=...))"
            for name in ("top_k", "max_nodes", "max_depth")
        },
    )
    def __init__(
        self,
        *,
        settings: RecyclingSettings | None = None,
        policy: Policy | None = None,
        cpu_kernels: bool | None = None,
    ):
        self.settings, self.policy = RecyclingSettings.of(settings), Policy.of(policy)
        self.cpu_kernels = cpu_kernels
        self.reset()

    def reset(self) -> None:
        """Forget every recycled candidate."""
        self.candidates = RecycledCandidates(self.settings.shape.top_k)
        self._owner: tuple | None = None

    def bind(self, target) -> None:
        """The verification profile the cost rule uses, measured on the target's device at the first call
        (:func:`~hf_cascade.measure.bound_verify_cost`)."""
        self.verify_cost = bound_verify_cost(self.policy, target)

    def new_drafter(
        self, target, generation_config, logits_processor, stats=None, target_tokenizer=None
    ) -> TokenRecycling:
        config = target.config.get_text_config()
        if int(config.vocab_size) > 2**24:
            raise ValueError(
                f"RecyclingAssistant reads token ids as float32 (exact below 2**24); this target's "
                f"vocabulary has {config.vocab_size} tokens"
            )
        owner = (id(target), getattr(target.config, "_name_or_path", None), int(config.vocab_size))
        if owner != self._owner or not self.settings.hot_start:  # another target's candidates are not this one's
            self.reset()
            self._owner = owner
        seeds = self.settings.max_ngram if self.policy.lookup else 0
        return TokenRecycling(
            self.candidates,
            self.settings.shape,
            DraftPolicy.of(self.policy, self.verify_cost),
            seeds,
            self.settings.max_matches,
        )


__all__ = ["RecyclingAssistant"]
