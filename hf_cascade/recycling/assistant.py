"""``generate(..., assistant_model=RecyclingAssistant())``: Token Recycling (Luo et al., 2024), no draft model; the
step itself is :class:`~hf_cascade.recycling.drafter.TokenRecycling`'s."""

from __future__ import annotations

from ..assistant import TreeAssistant
from ..core.payoff import AdaptiveBudget, VerifyCost
from ..measure import bound_verify_cost
from .candidates import RecycledCandidates, RecyclingShape
from .drafter import TokenRecycling


class RecyclingAssistant(TreeAssistant):
    """``generate(..., assistant_model=RecyclingAssistant())``: Token Recycling, no draft model (see
    :mod:`hf_cascade.recycling.drafter`). Greedy output equals plain ``generate``; sampling is exact.

    Args:
        top_k / max_nodes / max_depth: the candidate tree (:class:`RecyclingShape`).
        verify_cost: a :class:`~hf_cascade.core.payoff.VerifyCost` (default ``VerifyCost()``: measured on the
            target's device at first use): each step verifies only the candidates that pay for their rows
            (:class:`~hf_cascade.core.payoff.AdaptiveBudget`); ``None``: the whole expanded tree.
        max_ngram / max_matches: longest suffix match whose continuations join the candidates, and how many of
            its most recent occurrences are counted (frequency-ranked; 1: Max-Gram's one continuation);
            ``max_ngram=0``: none (the paper's table alone).
        hot_start: keep the recycled candidates across the calls of this assistant with one target (see
            :mod:`hf_cascade.recycling.drafter`; a different target, or :meth:`reset`, starts an empty table).
            Default: one table per call.
        cpu_kernels: see :mod:`hf_cascade.backends`.

    Example::

        from hf_cascade import RecyclingAssistant
        out = model.generate(ids, assistant_model=RecyclingAssistant(), do_sample=True, temperature=0.7)
    """

    def __init__(self, top_k: int = 8, max_nodes: int = 32, max_depth: int = 8,
                 max_ngram: int = 8, max_matches: int = 16, verify_cost: VerifyCost | None = VerifyCost(),
                 hot_start: bool = False, cpu_kernels: bool | None = None):
        if verify_cost is not None and not isinstance(verify_cost, VerifyCost):
            raise TypeError(f"verify_cost must be a hf_cascade.core.payoff.VerifyCost or None, got {type(verify_cost).__name__}")
        self.shape = RecyclingShape(int(top_k), int(max_nodes), int(max_depth))
        self.max_ngram, self.max_matches = int(max_ngram), int(max_matches)
        self.verify_cost = verify_cost
        self.hot_start = bool(hot_start)
        self.cpu_kernels = cpu_kernels
        self.reset()

    def reset(self) -> None:
        """Forget every recycled candidate."""
        self.candidates = RecycledCandidates(self.shape.top_k)
        self._owner: tuple | None = None

    def bind(self, target) -> None:
        """Measure the verification profile of ``VerifyCost()`` (once per device kind)."""
        self.bound_cost = bound_verify_cost(self.verify_cost, target)

    def new_drafter(self, target, generation_config, logits_processor, stats=None, target_tokenizer=None) -> TokenRecycling:
        config = target.config.get_text_config()
        if int(config.vocab_size) > 2 ** 24:
            raise ValueError(f"RecyclingAssistant reads token ids as float32 (exact below 2**24); this target's "
                             f"vocabulary has {config.vocab_size} tokens")
        owner = (id(target), getattr(target.config, "_name_or_path", None), int(config.vocab_size))
        if owner != self._owner or not self.hot_start:    # another target's candidates are not this one's
            self.reset()
            self._owner = owner
        budget = AdaptiveBudget(self.bound_cost) if self.bound_cost is not None else None
        return TokenRecycling(self.candidates, self.shape, budget, self.max_ngram, self.max_matches)


__all__ = ["RecyclingAssistant"]
