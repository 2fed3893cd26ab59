"""Max-Gram tree: prompt lookup with several continuations, verified as one token tree.

:class:`~hf_cascade.drafters.maxgram.MaxGram` proposes what followed the most recent occurrence of
the longest suffix of the sequence that occurred before. When the text branches (the same words
were followed by different words at different places), that single guess is often wrong while an
older occurrence, or that of a shorter suffix, was right. :class:`MaxGramTree` proposes up to
``branches`` *distinct* continuations of ``depth`` tokens and merges them into one tree
(:func:`~hf_cascade.core.structure.prefix_tree`: shared prefixes become shared nodes); the target verifies all of
them in one forward and keeps the longest one it agrees with.

Continuations, best evidence first (beam 0 is exactly Max-Gram's own guess):

* suffix lengths ``n`` from the longest match (at most ``max_ngram``) down to ``min_ngram``;
* for each ``n``, the occurrences of the length-``n`` suffix from the most recent backwards: each
  one is found with Max-Gram's own suffix match on the sequence cut
  just after the previous occurrence (that cut sequence ends with the same ``n`` tokens, so its most
  recent earlier match of length ``n`` is the previous occurrence);
* a continuation that runs into the end of the sequence wraps around (the text repeats with that
  period): Max-Gram's :func:`~hf_cascade.drafters.maxgram.follow`; duplicate continuations are skipped; at most
  ``max_scan`` occurrences are examined per step.

The tree is a deterministic function of the context (``draft_probs = None``), which
``sampling_tree_accept`` handles exactly, so sampling stays lossless.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.strategy import TreeDrafter, TreeStep
from ..core.structure import TokenTree, prefix_tree
from ..drafters.maxgram import follow, suffix_match


@dataclass
class MaxGramTree(TreeDrafter):
    """Max-Gram tree drafter (stateless: one instance may serve every call).

    Args:
        branches: most distinct continuations (leaves of the tree).
        depth: tokens per continuation (the tree's depth; pruned to the length budget).
        max_ngram: longest suffix match searched for.
        min_ngram: shortest suffix match used.
        max_scan: most occurrences examined per step (bounds the drafting cost on long sequences).
    """

    branches: int = 4
    depth: int = 6
    max_ngram: int = 8
    min_ngram: int = 1
    max_scan: int = 16

    def __post_init__(self) -> None:
        if self.branches < 1 or self.depth < 1 or self.max_scan < 1:
            raise ValueError("MaxGramTree needs branches >= 1, depth >= 1 and max_scan >= 1")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError("MaxGramTree needs 1 <= min_ngram <= max_ngram")
        self.linear = self.branches == 1  # one continuation: a chain, verified without a tree mask

    def continuations(self, seq: torch.Tensor, depth: int) -> torch.Tensor:
        """``[w, depth]`` distinct continuations of ``seq`` (``[L]``), best evidence first (``w <= branches``)."""
        beams = self.continuation_lists(seq.tolist(), depth)
        return torch.tensor(beams, dtype=seq.dtype, device=seq.device) if beams else seq.new_zeros(0, depth)

    def continuation_lists(self, tokens: list[int], depth: int) -> list[list[int]]:
        """:meth:`continuations` on a host token list (no device reads)."""
        longest, _ = suffix_match(tokens, self.max_ngram)
        beams: list[list[int]] = []
        seen: set[tuple[int, ...]] = set()
        scans = 0
        for n in range(longest, self.min_ngram - 1, -1):
            cut = len(tokens)
            while len(beams) < self.branches and scans < self.max_scan:
                m, end = suffix_match(tokens[:cut], n)
                scans += 1
                if m < n:
                    break  # no earlier occurrence of this n-gram
                cont = follow(tokens, end, depth)
                if tuple(cont) not in seen:
                    seen.add(tuple(cont))
                    beams.append(cont)
                cut = end + 1
            if len(beams) >= self.branches or scans >= self.max_scan:
                break
        return beams

    def draft_tree(self, seq: torch.Tensor, state: TreeStep) -> tuple[TokenTree, None]:
        depth = min(self.depth, state.budget)
        tokens = state.tokens if state.tokens is not None else seq.tolist()
        beams = self.continuation_lists(tokens, depth) if depth > 0 else []
        if not beams:
            return TokenTree.empty(seq.device), None
        tree, _, _ = prefix_tree(torch.tensor(beams, dtype=seq.dtype, device=seq.device))
        return tree, None


__all__ = ["MaxGramTree"]
