"""The sequence's own repeats as branches of a model-drafted tree (GLIDE, ReDrafter): a lookup branch.

A small drafter trained on chat text guesses poorly where the answer copies its prompt (extraction,
translation of names and numbers, code edits), exactly where prompt lookup guesses best. SpecInfer (Miao et
al., 2024) verifies the merged token trees of several speculators in one target forward; this module merges
one more speculator, the frequency-ranked continuations of the sequence's longest repeated suffix
(:func:`~hf_cascade.drafters.continuations.suffix_continuations`, SuffixDecoding's scoring), into the model's
tree before the cost cut:

* **join** (:meth:`LookupBranch.join`): a seed token equal to a model node below the same parent is that node
  (estimated at the larger of the two estimates), any other seed token a new node;
* **estimate**: a seed token of share ``s`` after a match of length bucket ``b`` is estimated at
  ``rate_b * s``, learned from the target's verdicts in this call
  (:class:`~hf_cascade.drafters.continuations.SeedRates`, as Token Recycling's seeds); the model's nodes keep
  their calibrated probabilities;
* **cut** (:meth:`LookupBranch.select`): the merged tree goes through the call's policy (the nodes that pay
  for their measured verification cost, :meth:`~hf_cascade.core.payoff.DraftPolicy.keep`); a drafter that sends
  chains (``linear``) keeps the one path with the most expected accepted tokens.

The seeds cost no draft forward, so a step the model's rule 1 refuses (its drafts do not pay) still verifies
a repeat worth verifying. Not in GLIDE's or ReDrafter's paper (their drafts come from the head alone);
``lookup=False`` on their assistants drafts as the papers do. The seeds are a deterministic function of the
context (point masses), so greedy output still equals plain ``generate`` and sampling stays exact; beside
nodes *drawn* from a drafter's ``q`` (GLIDE under sampling) seeds join as separate siblings, never merged
(:meth:`LookupBranch.select`'s ``drawn``).
"""

from __future__ import annotations

from typing import NamedTuple

from ..core.accept import path_list
from ..core.draws import keep_drawn
from ..core.stats import LevelStats
from ..core.structure import TokenTree
from .continuations import SeedRates, SeedTrie, continuation_trie, suffix_continuations
from .memory import AnswerMemory

#: The rate buckets of seeds from the answer memory start here (the sequence's own: 1 .. 4).
MEMORY_SEEDS = 10


class LookupBranch:
    """The lookup branch of one drafter in one ``generate()`` call (see the module docstring).

    Args:
        max_ngram: longest suffix match searched for.
        max_matches: most recent occurrences of that suffix whose continuations are counted.
        depth: deepest seed token (further cut to the length budget and by the cost rule).
        memory: the assistant's answers of earlier calls (``Policy(memory=...)``): where the longest suffix found
            there is longer than the sequence's own, the seeds are its continuations there (most recent first),
            rated in buckets of their own (:data:`MEMORY_SEEDS` plus the match's length bucket).
    """

    def __init__(self, max_ngram: int = 8, max_matches: int = 16, depth: int = 8, memory: AnswerMemory | None = None):
        if max_ngram < 1 or max_matches < 1 or depth < 1:
            raise ValueError(
                f"LookupBranch needs max_ngram, max_matches and depth >= 1, got {max_ngram}, {max_matches}, {depth}"
            )
        self.max_ngram, self.max_matches, self.depth = int(max_ngram), int(max_matches), int(depth)
        self.memory = memory
        self.rates = SeedRates()
        self._bucket = 0
        self._shares: list[float] = []  # the last selected tree's seed shares per node (0: not a seed)
        self.steps = self.proposed = self.accepted = 0  # steps with seeds, seed nodes verified, seed nodes accepted

    def join(
        self, tree: TokenTree, estimates: list[float], tokens: list[int], depth: int, merge: bool = True
    ) -> tuple[TokenTree, list[float], list[bool], list[float]]:
        """``tree`` (the model's, node estimates ``estimates``) with the seeds after ``tokens`` (the verified
        sequence, host list) merged in: ``(tree, estimates, from_model, shares)`` in the merged node order
        (the model's nodes first, unchanged). ``merge=False``: every seed is a new node, none shares a model
        node (a tree with drawn nodes: whether a seed and a drawn node coincide depends on the draw)."""
        host_tokens, host_parents, estimates, from_model, shares = self._merged(tree, estimates, tokens, depth, merge)
        if host_tokens is not None and len(host_tokens) > tree.num_nodes:
            tree = TokenTree.from_host(host_tokens, host_parents, tree.tokens.device)
        return tree, estimates, from_model, shares

    def _merged(
        self, tree: TokenTree, estimates: list[float], tokens: list[int], depth: int, merge: bool
    ) -> tuple[list[int] | None, list[int], list[float], list[bool], list[float]]:
        """:meth:`join` on the host: the merged tree as host lists of tokens (``None``: no seed joined, ``tree``
        as it is) and parents, and the node lists."""
        depth = min(self.depth, depth)
        trie, bucket = self._seeds(tokens, depth) if depth > 0 else (None, 0)
        n = tree.num_nodes
        estimates, from_model, shares = list(estimates), [True] * n, [0.0] * n
        if trie is None or not trie.children:  # no seed: the tree's tokens are not read
            return None, list(tree.host_parents), estimates, from_model, shares
        host_tokens, host_parents = list(tree.token_list), list(tree.host_parents)
        self._bucket = bucket
        rate = self.rates.rate(self._bucket)
        below = {(p, t): i for i, (p, t) in enumerate(zip(host_parents, host_tokens))} if merge else {}
        children = trie.children
        todo = [(-1, -1)]  # (trie node, its tree node), level order
        for at, node in todo:  # (the loop reaches what it appends)
            if at not in children:
                continue
            for token, share, child in children[at]:
                key = (node, token)
                estimate = rate * share
                if key in below:  # a model node: the larger estimate
                    i = below[key]
                    if estimate > estimates[i]:  # max(estimates[i], estimate)
                        estimates[i] = estimate
                    shares[i] = share
                else:  # a new node (parents precede children)
                    i = below[key] = len(host_tokens)
                    host_tokens.append(token)
                    host_parents.append(node)
                    estimates.append(estimate if estimate > 0.0 else 0.0)  # max(0.0, estimate)
                    from_model.append(False)
                    shares.append(share)
                todo.append((child, i))
        return host_tokens, host_parents, estimates, from_model, shares

    def _seeds(self, tokens: list[int], depth: int) -> tuple[SeedTrie, int]:
        """The seed trie after ``tokens`` and its rate bucket: the sequence's own repeats, or the memory's where its
        match is longer."""
        trie = suffix_continuations(tokens, self.max_ngram, depth, self.max_matches)
        if self.memory is not None:
            m, found = self.memory.occurrences(tokens, self.max_ngram, self.max_matches)
            if m > trie.match:
                trie = continuation_trie(m, [tuple(answer[end + 1 : end + 1 + depth]) for answer, end in found])
                return trie, MEMORY_SEEDS + SeedRates.bucket(m)
        return trie, SeedRates.bucket(trie.match)

    def cut(
        self, policy, tree: TokenTree, probs: list[float], state, linear: bool = False, drawn: int = 0
    ) -> tuple[TokenTree, list[float | None]]:
        """:meth:`select` after the verified sequence of ``state`` (a
        :class:`~hf_cascade.core.strategy.TreeStep`: its host tokens, its length budget)."""
        tokens = state.tokens if state.tokens is not None else state.seq.tolist()
        return self.select(policy, tree, probs, tokens, state.budget, linear, drawn)

    def select(
        self,
        policy,
        tree: TokenTree,
        probs: list[float],
        tokens: list[int],
        depth: int,
        linear: bool = False,
        drawn: int = 0,
    ) -> tuple[TokenTree, list[float | None]]:
        """Join the seeds to the model's ``tree`` (draft probabilities ``probs``, node order), calibrate the
        model's nodes with ``policy`` (the call's :class:`~hf_cascade.core.payoff.DraftPolicy`) and keep what pays.
        Returns the kept tree and, per kept node, its draft probability (``None`` for a seed-only node: the
        policy calibrates the model's probabilities only, :meth:`~hf_cascade.core.payoff.AdaptiveBudget.observe_step`).

        ``drawn``: the model's first ``drawn`` nodes were drawn from its ``q`` (sampling, a tree drafter): they
        are all kept (:func:`~hf_cascade.core.draws.keep_drawn`), seeds share no node with the model's tree,
        and every estimate must not depend on the drawn tokens (``probs`` of a drawn node: its confidence),
        so which seeds are verified does not either; the seeds' ``q`` rows are one-hot (appended after the
        model's nodes, as :func:`~hf_cascade.core.draws.tree_draft_probs` builds them). SpecInfer's
        multi-draft rule is exact for such independent siblings, duplicates included. The merged tree stays on the
        host until the cut: one tree is made, the kept one."""
        if drawn and linear:
            raise ValueError("a drawn chain is verified in full: no lookup branch beside it")
        estimates = policy.calibrated_all(probs)
        host_tokens, parents, estimates, from_model, shares = self._merged(tree, estimates, tokens, depth, not drawn)
        node_probs = [probs[i] if model else None for i, model in enumerate(from_model)]
        nodes, sub = list(range(len(parents))), parents  # the merged tree's nodes still in, their parents
        if linear and nodes:  # one path: the best one
            nodes = _path_nodes(parents, estimates)
            sub = _renumbered(parents, nodes)
        if not nodes:
            self._shares = []
            return tree, []
        keep = keep_drawn(policy.keep(_Merged(tuple(sub)), [estimates[i] for i in nodes]), drawn)
        nodes = [i for i, k in zip(nodes, keep) if k]
        node_probs, self._shares = [node_probs[i] for i in nodes], [shares[i] for i in nodes]
        if host_tokens is None:  # the model's tree alone: cut as it is
            kept = set(nodes)
            tree = tree.select([i in kept for i in range(tree.num_nodes)])
        else:
            tree = TokenTree.from_host([host_tokens[i] for i in nodes], _renumbered(parents, nodes), tree.tokens.device)
        seeds = 0
        for share in self._shares:
            if share > 0:
                seeds += 1
        self.steps += int(seeds > 0)
        self.proposed += seeds
        return tree, node_probs

    def observe(self, tree: TokenTree, path: list[int]) -> None:
        """The target's verdict on the last selected tree (accepted node indices ``path``): learn the seeds'
        rate from the seed nodes it reached. A tree the loop cut (EOS, length) is not learned from."""
        shares, self._shares = self._shares, []
        if len(shares) != tree.num_nodes or not any(shares):
            return
        on_path = set(path)
        for i, parent in enumerate(tree.host_parents):
            if shares[i] > 0 and (parent < 0 or parent in on_path):
                self.rates.observe(self._bucket, shares[i], i in on_path)
                self.accepted += int(i in on_path)

    def level(self) -> LevelStats:
        """This call's seeds as a statistical level (no forwards): steps with seeds verified, seed nodes
        verified (shared with the model's nodes included) and accepted."""
        return LevelStats("lookup", proposals=self.steps, tokens_proposed=self.proposed, tokens_accepted=self.accepted)


def observe_verdict(
    policy, lookup: LookupBranch | None, tree: TokenTree, probs: list[float | None], acceptance, state
) -> None:
    """A tree drafter's step after the target's verdict ``acceptance`` on ``tree``: ``policy`` (the call's
    :class:`~hf_cascade.core.payoff.DraftPolicy`) learns the step from the nodes' draft probabilities ``probs``
    and ``state``'s measured verification (a :class:`~hf_cascade.core.strategy.TreeStep`), and ``lookup`` (if any)
    learns its seeds' rate."""
    path = path_list(acceptance)
    policy.observe(tree, probs if tree.num_nodes else [], path, len(path) + 1, state.verify_seconds, state.verify_nodes)
    if lookup is not None:
        lookup.observe(tree, path)


class _Merged(NamedTuple):
    """A merged tree still on the host, as the policy's node rule reads a tree (its host structure)."""

    host_parents: tuple[int, ...]

    @property
    def num_nodes(self) -> int:
        return len(self.host_parents)


def _path_nodes(parents: list[int], estimates: list[float]) -> list[int]:
    """The nodes (root first) of the path with the most expected accepted tokens (sum of path estimates) of the
    tree of host ``parents``."""
    reach, gain = [0.0] * len(parents), [0.0] * len(parents)
    for i, p in enumerate(parents):
        reach[i] = estimates[i] * (reach[p] if p >= 0 else 1.0)
        gain[i] = reach[i] + (gain[p] if p >= 0 else 0.0)
    node = max(range(len(parents)), key=lambda i: (gain[i], -i))
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def _renumbered(parents: list[int], nodes: list[int]) -> list[int]:
    """The parents of the subtree of ``nodes`` (ascending, closed under ancestors: a dropped parent is a KeyError)
    in its own numbering."""
    new_index = {old: new for new, old in enumerate(nodes)}
    return [new_index[parents[i]] if parents[i] >= 0 else -1 for i in nodes]


__all__ = ["MEMORY_SEEDS", "LookupBranch", "observe_verdict"]
