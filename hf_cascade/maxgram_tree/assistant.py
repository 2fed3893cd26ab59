"""``generate(..., assistant_model=MaxGramTreeAssistant())``: prompt lookup with several continuations, verified as one
token tree; the drafting is :class:`~hf_cascade.maxgram_tree.drafter.MaxGramTree`'s."""

from __future__ import annotations

from ..assistant import TreeAssistant
from .drafter import MaxGramTree


class MaxGramTreeAssistant(TreeAssistant):
    """``generate(..., assistant_model=MaxGramTreeAssistant())``: prompt lookup with a token tree of
    up to ``branches`` continuations of ``depth`` tokens, verified in one target forward per step.

    Greedy outputs equal plain ``generate``; sampling is lossless. ``cpu_kernels``: see
    :mod:`hf_cascade.backends`. After each call ``assistant.last_stats`` is a
    :class:`~hf_cascade.core.strategy.TreeStats` (tokens per target call, accepted length per step,
    tree sizes, accepted paths).

    Example::

        import hf_cascade
        from hf_cascade.maxgram_tree import MaxGramTreeAssistant
        a = MaxGramTreeAssistant(branches=4, depth=6)
        out = model.generate(ids, assistant_model=a, max_new_tokens=128)
        a.last_stats.tokens_per_target_call, a.last_stats.tree_sizes
    """

    def __init__(
        self,
        *,
        branches: int = 4,
        depth: int = 6,
        max_ngram: int = 8,
        min_ngram: int = 1,
        max_scan: int = 16,
        cpu_kernels: bool | None = None,
    ):
        self.drafter = MaxGramTree(branches, depth, max_ngram, min_ngram, max_scan)
        self.cpu_kernels = cpu_kernels

    def drafts_branches(self) -> bool:
        """Several continuations make a tree (flash attention cannot verify it); ``branches=1`` is a chain."""
        return self.drafter.branches > 1

    def new_drafter(
        self, target, generation_config, logits_processor, stats=None, target_tokenizer=None
    ) -> MaxGramTree:
        return self.drafter


__all__ = ["MaxGramTreeAssistant"]
