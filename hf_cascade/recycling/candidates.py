"""Token Recycling's table (:class:`RecycledCandidates`: the target's top-``k`` next tokens after each token) and
its best-first expansion into a candidate tree (:class:`Expansion`, shaped by :class:`RecyclingShape`)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..drafters.continuations import SeedTrie


@dataclass(frozen=True)
class RecyclingShape:
    """The candidate tree before the cost cut. ``top_k``: candidates kept per token (the paper's 8);
    ``max_nodes``: most nodes expanded per step; ``max_depth``: deepest node."""

    top_k: int = 8
    max_nodes: int = 32
    max_depth: int = 8

    def __post_init__(self) -> None:
        if self.top_k < 1 or self.max_nodes < 1 or self.max_depth < 1:
            raise ValueError(f"RecyclingShape needs top_k, max_nodes and max_depth >= 1, got {self}")


class RecycledCandidates:
    """``token -> (tokens, probabilities)``: the target's top-``k`` next tokens the last time it ran after
    ``token`` (host values)."""

    def __init__(self, top_k: int = 8):
        self.top_k = int(top_k)
        self.table: dict[int, tuple[list[int], list[float]]] = {}

    def __len__(self) -> int:
        return len(self.table)

    def record(self, rows, row_tokens: list[int]) -> None:
        """Record the rows of ``rows`` (a :class:`~hf_cascade.core.rows.TreeRows`) computed already; row ``r``
        follows the token ``row_tokens[r]``. One top-k and one device read."""
        computed = sorted(r for r in rows.computed() if r < len(row_tokens))
        if not computed:
            return
        probs = rows.softmax().stack(computed)  # the view acceptance read (sampling): rows not recomputed
        values, index = probs.topk(min(self.top_k, probs.shape[-1]), dim=-1)
        host = torch.stack([values.float(), index.float()]).tolist()  # one read; float32 ids exact below 2**24
        for r, vals, ids in zip(computed, host[0], host[1]):
            if vals[-1] > 0.0:  # sorted: every probability positive (the usual case)
                self.table[row_tokens[r]] = (list(map(int, ids)), vals)
                continue
            kept = [(int(i), v) for i, v in zip(ids, vals) if v > 0.0]
            self.table[row_tokens[r]] = ([i for i, _ in kept], [v for _, v in kept])

    def expand(
        self,
        root: int,
        shape: RecyclingShape,
        depth: int,
        seed: SeedTrie | list[int] | None = None,
        seed_estimate=0.5,
        estimate=None,
    ) -> Expansion:
        """Best-first expansion below ``root``: at most ``shape.max_nodes`` nodes no deeper than ``depth``, in
        decreasing path estimate (parents first; each node's first child is its most probable one).

        A recycled node's estimate is ``estimate(p)`` of its recycled probability ``p`` (default: ``p``). The
        tokens of ``seed`` (continuations found elsewhere: a :class:`~hf_cascade.drafters.continuations.SeedTrie`
        below the root, or one path as a list) are estimated at the larger of ``seed_estimate(share)`` (a
        number: ``seed_estimate * share``) and that; a token both recycled and seeded is one node."""
        estimate = estimate or (lambda p: p)
        seeded = seed_estimate if callable(seed_estimate) else (lambda share: seed_estimate * share)
        trie = seed if isinstance(seed, SeedTrie) else SeedTrie.path(list(seed or []))
        out = Expansion([], [], [], [], [], [])
        # the heap holds, per expanded node, only its best child not taken yet (its siblings wait in `groups`, in
        # order): the same pops as pushing every child, since a node's later children never come before its best
        heap: list[tuple[float, int, int, int]] = []  # (-path estimate, count, group, position in it)
        groups: list[list[tuple]] = []
        count = 0
        known: dict[int, list[tuple[int, float, float]]] = {}  # token -> its recycled (child, p, estimate(p))

        def recycled(token: int) -> list[tuple[int, float, float]]:
            """``token``'s recycled children with their estimates, once per token and expansion (``estimate`` is
            fixed during one)."""
            kids = known.get(token)
            if kids is None:
                kids = known[token] = [(c, p, estimate(p)) for c, p in zip(*self.table.get(token, ((), ())))]
            return kids

        def push(parent: int, token: int, path: float, level: int, at: int | None) -> None:
            """The children of a node (``token`` at ``level``; ``at``: its node in ``trie``, -1 for the root,
            ``None`` off the seeds)."""
            nonlocal count
            if level >= depth:
                return
            kids = recycled(token)
            seeds = trie.children.get(at) if at is not None else None
            if seeds:
                seeded_tokens = {t for t, _, _ in seeds}
                kids = [kid for kid in kids if kid[0] not in seeded_tokens]
            group = [
                (-path * e, count + i, parent, child, level, p, e, 0.0, None) for i, (child, p, e) in enumerate(kids, 1)
            ]
            count += len(group)
            if seeds:
                probs = dict((c, p) for c, p, _ in recycled(token))
                for child, share, node in seeds:
                    p = probs.get(child, 0.0)
                    e = max(seeded(share), estimate(p))
                    count += 1
                    group.append((-path * e, count, parent, child, level, p, e, share, node))
            if group:
                group.sort()  # by (key, count): count is unique
                groups.append(group)
                heapq.heappush(heap, (group[0][0], group[0][1], len(groups) - 1, 0))

        push(-1, root, 1.0, 0, -1)
        while heap and len(out.tokens) < shape.max_nodes:
            _, _, g, i = heapq.heappop(heap)
            group = groups[g]
            if i + 1 < len(group):  # its next sibling takes its place
                heapq.heappush(heap, (group[i + 1][0], group[i + 1][1], g, i + 1))
            neg, _, parent, token, level, p, e, share, at = group[i]
            out.tokens.append(token)
            out.parents.append(parent)
            out.probs.append(p)
            out.estimates.append(e)
            out.on_seed.append(at is not None)
            out.shares.append(share)
            if len(out.tokens) < shape.max_nodes:  # the last node's children could not be taken
                push(len(out.tokens) - 1, token, -neg, level + 1, at)
        return out


class Expansion(NamedTuple):
    """A candidate tree in node order (parents first): ``tokens``, ``parents``, ``probs`` (each node's recycled
    probability after its parent's token; 0 for a seed token the table does not hold), ``estimates`` (its
    estimated acceptance, what the order used), ``on_seed`` (whether it is a seed token), ``shares`` (a seed
    token's share of its parent's occurrences; 0 off the seeds)."""

    tokens: list[int]
    parents: list[int]
    probs: list[float]
    estimates: list[float]
    on_seed: list[bool]
    shares: list[float]


__all__ = ["Expansion", "RecycledCandidates", "RecyclingShape"]
