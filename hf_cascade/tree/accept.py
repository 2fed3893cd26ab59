"""Accepting a path of a verified token tree: greedy (exact) and lossless multi-draft sampling.

Row convention: ``target[0]`` is the target's (processed) distribution / logits at the root (the
last verified token), ``target[i + 1]`` at tree node ``i``: the next-token distribution after the
path root -> ``i``. Both functions return a :class:`TreeAcceptance` ``(path, bonus)``: the accepted
node indices from the root down (``tree.tokens[path]`` are the accepted tokens) and the one token
the target contributes after them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .structure import TokenTree


class TreeAcceptance(NamedTuple):
    """``path``: ``[m]`` LongTensor of accepted node indices (root excluded, root -> leaf order);
    ``bonus``: the target's token after the last accepted node."""

    path: torch.Tensor
    bonus: int


def _full_rows(tree: TokenTree, rows: torch.Tensor, node_rows: torch.Tensor | None, name: str) -> torch.Tensor:
    if node_rows is not None:
        rows = torch.cat([rows.reshape(1, -1), node_rows.to(rows.device)], dim=0)
    if rows.ndim != 2 or rows.shape[0] != tree.num_nodes + 1:
        raise ValueError(f"{name} must be [n + 1, V] = [{tree.num_nodes + 1}, V] (root first), got {tuple(rows.shape)}")
    return rows


def greedy_tree_accept(tree: TokenTree, logits: torch.Tensor, node_logits: torch.Tensor | None = None) -> TreeAcceptance:
    """Greedy tree verification (SpecInfer's greedy token tree verification, Miao et al., 2024, §4).

    Args:
        logits: ``[n + 1, V]`` (root row first), or the root's ``[V]`` when ``node_logits``
            (``[n, V]``) is given.

    From the root, the target's argmax at the current node selects the child holding that token;
    the walk stops when no child matches, and the bonus token is the argmax at the last accepted
    node. Vectorized: node ``i`` *matches* iff ``tokens[i] == argmax(logits[parents[i] + 1])``; the
    accepted path ends at the deepest node whose whole root path matches (lowest index among equally
    deep ones, which only matters for duplicate siblings), so the output is exactly greedy decoding.
    """
    logits = _full_rows(tree, logits, node_logits, "logits")
    best = logits.argmax(dim=-1)                                                   # [n + 1]
    if tree.num_nodes == 0:
        return TreeAcceptance(tree.tokens.new_zeros(0), int(best[0]))
    tokens, parents = tree.tokens.to(best.device), tree.parents.to(best.device)
    match = tokens == best[parents + 1]                                           # [n]
    anc = tree.ancestor_mask().to(best.device)                                    # [n, n]
    ok = ~(anc & ~match[None, :]).any(dim=-1)                                     # whole root path matches
    if not bool(ok.any()):
        return TreeAcceptance(tokens.new_zeros(0), int(best[0]))
    score = torch.where(ok, tree.depth.to(best.device), torch.full_like(tree.depth.to(best.device), -1))
    last = int(score.argmax())                                                    # first of the deepest
    path = anc[last].nonzero().flatten()                                          # ancestors: parents precede children
    return TreeAcceptance(path, int(best[last + 1]))


def sampling_tree_accept(
    tree: TokenTree,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> TreeAcceptance:
    """Lossless tree verification by recursive rejection sampling (RRS).

    Args:
        tree: the verified tree.
        target_probs: ``[n + 1, V]`` the target's processed distributions (root row first).
        draft_probs: ``[n, V]``: row ``i`` is the distribution node ``i``'s token was drawn from
            (conditioned on its parent's path), or ``None`` when the children are *deterministic*
            (top-k expansions, beam search, CAPE: a function of the context, no randomness).
        generator: optional ``torch.Generator`` for the uniforms and the final draw.

    At the current node with target distribution ``p`` and children ``c_1 .. c_m`` (tokens ``x_i``,
    tried in node order), start from the residual ``r_0 = p`` and for ``i = 1 .. m``:

    * accept ``c_i`` with probability ``min(1, r_{i-1}(x_i) / q_i(x_i))``, then descend into ``c_i``
      (its residual restarts at ``target_probs[c_i + 1]``);
    * otherwise ``r_i = norm(max(0, r_{i-1} - q_i))``.

    If every child is rejected (or the node is a leaf), the bonus token is drawn from the current
    residual ``r_m`` (``p`` itself at a leaf). This is SpecInfer's multi-step speculative sampling
    (Miao et al., 2024, §4, "MSS"): one step emits ``y`` with probability
    ``min(q_i(y), r(y)) + (1 - sum_z min(q_i(z), r(z))) * norm(max(0, r - q_i))(y) = r(y)``
    (Leviathan et al., 2023, Algorithm 1 and Appendix A.1), so by induction over the siblings,
    and then over the depth, every emitted token is distributed exactly as the target's ``p``. This needs each
    sibling token to be an independent draw from its ``q_i`` *in node order* (do not sort siblings
    by their values or merge duplicates of stochastic drafts; duplicates themselves are fine).

    Deterministic children (``draft_probs=None``) are the point-mass case ``q_i = delta(x_i)``:
    accept ``c_i`` with probability ``r_{i-1}(x_i)``; on rejection remove ``x_i``:
    ``r_i = r_{i-1}`` with ``x_i`` zeroed, renormalized. Then ``P(emit x_i) = prod_{j<i}(1 - r_{j-1}(x_j))
    * r_{i-1}(x_i) = p(x_i)`` and a non-child token ``y`` is emitted with probability
    ``(1 - sum_i p(x_i)) * p(y) / (1 - sum_i p(x_i)) = p(y)``: exact for any order and set of
    children, duplicates included (a removed token has probability 0).
    """
    if draft_probs is not None and tuple(draft_probs.shape[:1]) != (tree.num_nodes,):
        raise ValueError(f"draft_probs must be [n, V] = [{tree.num_nodes}, V], got {tuple(draft_probs.shape)}")
    target_probs = _full_rows(tree, target_probs, None, "target_probs")
    device = target_probs.device
    tokens = tree.tokens.tolist()
    children: list[list[int]] = [[] for _ in range(tree.num_nodes + 1)]
    for i, parent in enumerate(tree.parents.tolist()):
        children[parent + 1].append(i)

    path: list[int] = []
    row = 0                                   # node + 1 of the current node (0 = root)
    r = target_probs[0].float()
    while True:
        accepted = None
        for c in children[row]:
            x = tokens[c]
            u = float(torch.rand((), generator=generator, device=device))
            if draft_probs is None:
                if u < float(r[x]):
                    accepted = c
                    break
                r = r.clone()
                r[x] = 0.0
                r = r / r.sum()
            else:
                q = draft_probs[c].to(device).float()
                qx = float(q[x])
                if qx <= 0.0:
                    raise ValueError(f"node {c}'s token {x} has probability 0 under its draft distribution")
                if u < float(r[x]) / qx:
                    accepted = c
                    break
                residual = (r - q).clamp_min(0.0)
                mass = residual.sum()
                # mass == 0 means r <= q everywhere, i.e. r == q: the acceptance probability was 1,
                # so a rejection is only a rounding artefact; keep r.
                if float(mass) > 1e-12:
                    r = residual / mass
        if accepted is None:
            break
        path.append(accepted)
        row = accepted + 1
        r = target_probs[row].float()
    bonus = int(torch.multinomial(r, 1, generator=generator))
    return TreeAcceptance(torch.tensor(path, dtype=torch.long), bonus)
