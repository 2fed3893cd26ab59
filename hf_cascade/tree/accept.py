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


def _full_rows(tree: TokenTree, rows, node_rows: torch.Tensor | None, name: str):
    """``rows`` as an indexable of ``n + 1`` rows (root first): a ``[n + 1, V]`` tensor (checked), or a
    lazy :class:`~hf_cascade.tree.rows.TreeRows` (or its softmax view), passed through."""
    if not isinstance(rows, torch.Tensor):
        if node_rows is not None or len(rows) != tree.num_nodes + 1:
            raise ValueError(f"{name} must hold n + 1 = {tree.num_nodes + 1} rows (root first), got {len(rows)}")
        return rows
    if node_rows is not None:
        rows = torch.cat([rows.reshape(1, -1), node_rows.to(rows.device)], dim=0)
    if rows.ndim != 2 or rows.shape[0] != tree.num_nodes + 1:
        raise ValueError(f"{name} must be [n + 1, V] = [{tree.num_nodes + 1}, V] (root first), got {tuple(rows.shape)}")
    return rows


def _children(tree: TokenTree) -> list[list[int]]:
    """Row ``r`` -> the node indices of its children, in node order (row 0: the root)."""
    children: list[list[int]] = [[] for _ in range(tree.num_nodes + 1)]
    for i, parent in enumerate(tree.parents.tolist()):
        children[parent + 1].append(i)
    return children


def greedy_tree_accept(tree: TokenTree, logits, node_logits: torch.Tensor | None = None) -> TreeAcceptance:
    """Greedy tree verification (SpecInfer's greedy token tree verification, Miao et al., 2024, §4).

    Args:
        logits: ``[n + 1, V]`` (root row first), or the root's ``[V]`` when ``node_logits``
            (``[n, V]``) is given, or a lazy :class:`~hf_cascade.tree.rows.TreeRows`.

    A walk from the root: the target's argmax at the current node selects the children holding
    that token, and the walk descends into each of them (several only when sibling tokens repeat);
    the accepted path is the deepest fully matching one (lowest last-node index among equally deep
    ones) and the bonus token is the argmax at its end, so the output is exactly greedy decoding.
    Only the rows of the nodes the walk reaches are read: with :class:`TreeRows` the others are
    never computed.
    """
    rows = _full_rows(tree, logits, node_logits, "logits")
    tokens, children = tree.tokens.tolist(), _children(tree)
    best: dict[int, int] = {}

    def argmax(row: int) -> int:
        if row not in best:
            best[row] = int(rows[row].argmax())
        return best[row]

    accepted: list[int] = []
    stack: list[list[int]] = [[]]                        # paths still to extend, depth first
    while stack:
        path = stack.pop()
        row = path[-1] + 1 if path else 0
        target = argmax(row)
        for c in reversed(children[row]):                # pushed reversed: popped in node order
            if tokens[c] == target:
                longer = path + [c]
                if len(longer) > len(accepted) or (len(longer) == len(accepted) and c < accepted[-1]):
                    accepted = longer
                stack.append(longer)
    bonus = argmax(accepted[-1] + 1 if accepted else 0)
    return TreeAcceptance(torch.tensor(accepted, dtype=torch.long), bonus)


def sampling_tree_accept(
    tree: TokenTree,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> TreeAcceptance:
    """Lossless tree verification by recursive rejection sampling (RRS).

    Args:
        tree: the verified tree.
        target_probs: ``[n + 1, V]`` the target's processed distributions (root row first), or
            the lazy :meth:`TreeRows.softmax() <hf_cascade.tree.rows.TreeRows.softmax>` view: only
            the rows of the nodes the walk reaches are read.
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
    tokens, children = tree.tokens.tolist(), _children(tree)

    path: list[int] = []
    row = 0                                   # node + 1 of the current node (0 = root)
    r = target_probs[0].float()
    device = r.device
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
