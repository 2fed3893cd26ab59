"""Stopping: where a verified step's tokens must be cut, exactly as plain ``generate`` would stop.

* :func:`stop_token_ids` -- the generation's EOS ids, as a host set and a long tensor;
* :func:`prune_tree` -- before verification: drop draft nodes that can never be emitted (deeper than
  the length budget, or below an EOS node);
* :class:`Stopper` -- after acceptance: the number of the step's new tokens plain decoding would emit
  before stopping (EOS, ``max_length``, the generation's stopping criteria). EOS and ``max_length``
  are decided on host token ids; only stopping criteria other than transformers' own max-length / EOS
  ones are called (once per emitted token, as plain decoding calls them).
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig

from .structure import TokenTree


def stop_token_ids(cfg: GenerationConfig) -> tuple[set[int], torch.Tensor | None]:
    """The EOS ids of ``cfg``: a host set, and a long tensor (``None`` when there are none)."""
    eos = getattr(cfg, "_eos_token_tensor", None)
    if eos is None and cfg.eos_token_id is not None:
        eos = torch.as_tensor(cfg.eos_token_id)
    if eos is None:
        return set(), None
    ids = eos.flatten().long().cpu()
    return set(ids.tolist()), ids


def prune_tree(
    tree: TokenTree, draft_probs: torch.Tensor | None, budget: int, stop_ids: torch.Tensor | set[int] | None
) -> tuple[TokenTree, torch.Tensor | None]:
    """Drop nodes that can never be emitted: depth ``>= budget``, or below a stop (EOS) token.

    Whole subtrees are removed and every kept node keeps all its kept siblings, so
    ``sampling_tree_accept`` stays exact (a node whose children are all gone is a leaf, whose bonus
    token is drawn from the target's own distribution).

    Decided on the tree's host structure (``stop_ids``: a host set, or a tensor read once): no device read
    but the tree's tokens when it has stop ids to look for and its builder did not give them on the host
    (:attr:`TokenTree.token_list`, read once and kept for acceptance)."""
    n = tree.num_nodes
    if draft_probs is not None and draft_probs.shape[0] != n:
        raise ValueError(f"draft_probs must have one row per tree node: {n} nodes, {draft_probs.shape[0]} rows")
    if n == 0:
        return tree, draft_probs
    stop = set(stop_ids.flatten().tolist()) if isinstance(stop_ids, torch.Tensor) else set(stop_ids or ())
    depth, parents = tree.depth_list, tree.parent_list
    if stop:
        tokens = tree.token_list
        below_stop = [False] * n  # a strict ancestor is a stop token
        for i, p in enumerate(parents):
            below_stop[i] = p >= 0 and (below_stop[p] or tokens[p] in stop)
        keep = [d < budget and not b for d, b in zip(depth, below_stop)]
    else:
        keep = [d < budget for d in depth]
    if all(keep):
        return tree, draft_probs
    mask = torch.tensor(keep, dtype=torch.bool)
    return tree.select(keep), (draft_probs[mask.to(draft_probs.device)] if draft_probs is not None else None)


_HOST_CRITERIA = ("MaxLengthCriteria", "EosTokenCriteria")


class Stopper:
    """Decides, token by token, where plain decoding would stop (see the module docstring)."""

    def __init__(self, cfg: GenerationConfig, stopping_criteria=None):
        self.max_length = int(cfg.max_length)
        self.stop_set, self.stop_tensor = stop_token_ids(cfg)
        criteria = list(stopping_criteria or [])
        # transformers' own max-length / EOS criteria are decided on host ids below; others are called
        self.criteria = [c for c in criteria if type(c).__name__ not in _HOST_CRITERIA]
        self.eos_criteria = {
            int(t)
            for c in criteria
            if type(c).__name__ == "EosTokenCriteria"
            for t in torch.as_tensor(c.eos_token_id).flatten().tolist()
        }
        self.max_length = min(
            [self.max_length] + [int(c.max_length) for c in criteria if type(c).__name__ == "MaxLengthCriteria"]
        )

    def emitted(self, seq: torch.Tensor, length: int, new_tokens: list[int], scores=None) -> tuple[int, bool]:
        """``seq``: ``[L + m]`` the sequence with the ``m`` = ``len(new_tokens)`` new tokens appended
        (``length`` = ``L``); ``scores``: the scores tuple, the new tokens' rows included (criteria
        see it up to the token they judge). Returns how many of the new tokens are emitted and whether
        generation stops after them."""
        base = len(scores) - len(new_tokens) if scores is not None else 0
        for j, token in enumerate(new_tokens):
            n = length + j + 1
            if token in self.stop_set or token in self.eos_criteria or n >= self.max_length:
                return j + 1, True
            if self.criteria and any(
                bool(c(seq[None, :n], scores[: base + j + 1] if scores is not None else None).any())
                for c in self.criteria
            ):
                return j + 1, True
        return len(new_tokens), False


__all__ = ["Stopper", "prune_tree", "stop_token_ids"]
