"""Acceptance: the one place where a verifier's distributions decide which draft tokens stand.

**The target's acceptance of a draft** (a chain is a tree with one path). Row convention:
``target[0]`` is the target's (processed) distribution / logits at the root (the
last verified token), ``target[i + 1]`` at tree node ``i``: the next-token distribution after the
path root -> ``i``. Both functions return a :class:`TreeAcceptance` ``(path, bonus)``: the accepted
node indices from the root down (``tree.tokens[path]`` are the accepted tokens) and the one token
the target contributes after them.

**Reviews between drafters** (the cascade's and HSDDW's draft models reviewing a smaller level's
draft, with optional lenience): :func:`hf_cascade.core.review.greedy_review` and
:func:`~hf_cascade.core.review.sampling_review`.

One review = a reviewer model scores ``k`` draft tokens in one forward and emits ``n + 1`` tokens:
the ``n`` accepted drafts and one token of its own (a correction after a rejection, or a bonus
token when all ``k`` drafts were accepted).

* Greedy: Leviathan et al. (2023) / CS Drafting §3.1: accept while the draft equals the reviewer's
  argmax. With lenience ``l > 1`` a draft is also accepted when ``l * p(x) >= q(x)`` (CS Drafting's
  greedy rule, with ``q(x)`` the probability the drafting level gave its own token).
* Sampling: Leviathan et al. Algorithm 1 (speculative sampling). Accept ``x ~ q`` with probability
  ``min(1, l * p(x) / q(x))``; on rejection sample from ``norm(max(0, p - q / l))``. With ``l = 1``
  this is lossless: every emitted token is distributed as ``p``.

Lenience is only ever used when a *draft* model reviews (CS Drafting §3.1); the target's own
acceptance (the tree functions above) has no lenience. Because the cascade hands its drafts
upward, :func:`sampling_review` also returns ``out``: the exact distribution each emitted token was
drawn from (``q * accept + (1 - beta) * residual``, or ``p`` for the bonus token). That is the ``q``
the next reviewer (ultimately the target) must use, which keeps the whole cascade lossless at the
target even when lenience > 1 between drafters.

The review functions take one sequence without the batch dimension. Shapes: ``k`` drafts, vocabulary ``V``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..placement import HOST, upload
from .categorical import categorical
from .structure import TokenTree


class TreeAcceptance(NamedTuple):
    """``path``: ``[m]`` LongTensor of accepted node indices (root excluded, root -> leaf order);
    ``bonus``: the target's token after the last accepted node; ``nodes``: ``path`` as host ints when the
    acceptance built it on the host (the core's acceptance functions do), else ``None`` (read
    :func:`path_list`, which falls back to reading ``path``)."""

    path: torch.Tensor
    bonus: int
    nodes: tuple[int, ...] | None = None


def path_list(acceptance: TreeAcceptance) -> list[int]:
    """``acceptance.path`` as a list of host ints: its ``nodes`` when given (no read), else ``path`` read once."""
    nodes = getattr(acceptance, "nodes", None)
    if nodes is not None:
        return list(nodes)
    path = acceptance.path
    return path.tolist() if isinstance(path, torch.Tensor) else [int(i) for i in path]


def _full_rows(tree: TokenTree, rows, node_rows: torch.Tensor | None, name: str):
    """``rows`` as an indexable of ``n + 1`` rows (root first): a ``[n + 1, V]`` tensor (checked), or a
    lazy :class:`~hf_cascade.core.rows.TreeRows` (or its softmax view), passed through."""
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
    for i, parent in enumerate(tree.parent_list):  # the tree's host structure: no read
        children[parent + 1].append(i)
    return children


def _argmax_reader(rows):
    """``row -> int(argmax)``, reading the device as few times as possible: a ``[n + 1, V]`` tensor in one
    transfer for all rows; lazy rows through their ``argmax_block(r)`` when they have one (the argmax of
    row ``r`` and of the rows computed with it, ``{row: token}``, in one transfer), else one read per row."""
    if isinstance(rows, torch.Tensor):
        values = rows.argmax(dim=-1).tolist()
        return values.__getitem__
    block = getattr(rows, "argmax_block", None)
    best: dict[int, int] = {}

    def read(row: int) -> int:
        if row not in best:
            if block is not None:
                best.update(block(row))
            else:
                best[row] = int(rows[row].argmax())
        return best[row]

    return read


def greedy_tree_accept(tree: TokenTree, logits, node_logits: torch.Tensor | None = None) -> TreeAcceptance:
    """Greedy tree verification (SpecInfer's greedy token tree verification, Miao et al., 2024, §4).

    Args:
        logits: ``[n + 1, V]`` (root row first), or the root's ``[V]`` when ``node_logits``
            (``[n, V]``) is given, or a lazy :class:`~hf_cascade.core.rows.TreeRows`.

    A walk from the root: the target's argmax at the current node selects the children holding
    that token, and the walk descends into each of them (several only when sibling tokens repeat);
    the accepted path is the deepest fully matching one (lowest last-node index among equally deep
    ones) and the bonus token is the argmax at its end, so the output is exactly greedy decoding.
    Only the rows of the nodes the walk reaches are read: with :class:`TreeRows` the others are
    never computed.
    """
    rows = _full_rows(tree, logits, node_logits, "logits")
    tokens, children = tree.token_list, _children(tree)
    argmax = _argmax_reader(rows)

    accepted: list[int] = []
    stack: list[list[int]] = [[]]  # paths still to extend, depth first
    while stack:
        path = stack.pop()
        row = path[-1] + 1 if path else 0
        target = argmax(row)
        for c in reversed(children[row]):  # pushed reversed: popped in node order
            if tokens[c] == target:
                longer = path + [c]
                if len(longer) > len(accepted) or (len(longer) == len(accepted) and c < accepted[-1]):
                    accepted = longer
                stack.append(longer)
    bonus = argmax(accepted[-1] + 1 if accepted else 0)
    return TreeAcceptance(torch.tensor(accepted, dtype=torch.long, device="cpu"), bonus, tuple(accepted))  # host path


def sampling_tree_accept(
    tree: TokenTree,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    batched: bool | None = None,
) -> TreeAcceptance:
    """Lossless tree verification by recursive rejection sampling (RRS).

    Args:
        tree: the verified tree.
        target_probs: ``[n + 1, V]`` the target's processed distributions (root row first), or
            the lazy :meth:`TreeRows.softmax() <hf_cascade.core.rows.TreeRows.softmax>` view: only
            the rows of the nodes the walk reaches are read.
        draft_probs: ``[n, V]``: row ``i`` is the distribution node ``i``'s token was drawn from
            (conditioned on its parent's path), or ``None`` when the children are *deterministic*
            (top-k expansions, beam search, CAPE: a function of the context, no randomness).
        generator: optional ``torch.Generator`` for the uniforms and the final draw.
        batched: how the device is read. ``False``: child by child, a uniform drawn only when a child is
            tried (several host reads per child; free on a CPU). ``True``: two reads in all where every node's
            children after its first are point masses (:func:`_walk_gathered`: chains, point-mass siblings, a drawn
            child with point-mass siblings); otherwise one transfer per node on the walk (the residuals after rejecting
            each child in turn computed on the device, one uniform per child read with the acceptance probabilities).
            Uniforms are drawn for every child, so the random stream differs from ``False``'s; the law is the same.
            ``None`` (default): ``False`` on a CPU, ``True`` elsewhere.

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
    tokens, children = tree.token_list, _children(tree)

    path: list[int] = []
    row = 0  # node + 1 of the current node (0 = root)
    r = target_probs[0].float()
    device = r.device
    if batched is None:
        batched = device.type != "cpu"
    if batched:
        walked = _walk_gathered(tree, target_probs, draft_probs, generator)
        if walked is not None:
            return walked
    try_children = _try_batched if batched else _try_in_turn
    while True:
        accepted, r = try_children(children[row], tokens, r, draft_probs, generator)
        if accepted is None:
            break
        path.append(accepted)
        row = accepted + 1
        r = target_probs[row].float()
    bonus = int(categorical(r, generator))
    return TreeAcceptance(
        torch.tensor(path, dtype=torch.long, device="cpu"), bonus, tuple(int(i) for i in path)
    )  # host path


def _residual(r: torch.Tensor, x: int, q: torch.Tensor | None) -> torch.Tensor:
    """The residual after rejecting token ``x`` drawn from ``q`` (``None``: the point mass at ``x``)."""
    if q is None:
        r = r.clone()
        r[x] = 0.0
        return r / r.sum()
    residual = (r - q).clamp_min(0.0)
    mass = residual.sum()
    # mass == 0 means r <= q everywhere, i.e. r == q: the acceptance probability was 1,
    # so a rejection is only a rounding artefact; keep r.
    return torch.where(mass > 1e-12, residual / mass.clamp_min(1e-30), r)


def _walk_gathered(tree: TokenTree, target_probs, draft_probs, generator) -> TreeAcceptance | None:
    """The walk of :func:`_try_in_turn` reading the device twice: once for every node's uniform, its target
    probability at its parent's row and its draft probability (one gather), once for the bonus token. ``None``
    where a node's siblings after its first child are not all point masses (their residuals depend on one another
    in ways a gather does not give: :func:`_try_batched`).

    Point-mass siblings need nothing but ``r(x_i)`` of the residual ``r`` they are tried against: after rejecting
    ``x_1 .. x_{i-1}`` the residual is ``r`` without those tokens, renormalised, so ``r_{i-1}(x_i) = r(x_i) / (1 - sum
    of the distinct earlier r(x_j))`` (``0`` for a repeated token). A first child drawn from ``q`` needs
    ``p(x) / q(x)``; after its rejection the residual is ``max(0, p - q) / mass`` (``p`` where ``mass`` vanishes, as
    :func:`_residual`), so its point-mass siblings (GLIDE's CAPE expansions beside a drawn main token, seeds) are tried
    against that: ``max(0, p(x_i) - q(x_i))`` and ``mass`` come in the same gather. The bonus is drawn from the
    residual at the node where the walk stops (:func:`_try_in_turn`'s)."""
    children, tokens = _children(tree), tree.token_list
    n = tree.num_nodes
    if n == 0:
        return None
    parent_rows = [p + 1 for p in tree.parent_list]
    needed = sorted(set(parent_rows))
    stacked = torch.stack([target_probs[r].float() for r in needed])  # [R, V]
    device = stacked.device
    where = {r: i for i, r in enumerate(needed)}
    token_index, parent_index = upload(
        torch.tensor([list(tokens), [where[r] for r in parent_rows]], dtype=torch.long, device=HOST), device
    )  # one copy
    p_x = stacked[parent_index, token_index]
    u = torch.rand(n, generator=generator, device=device)
    firsts = [kids[0] for kids in children if len(kids) > 1] if draft_probs is not None else []
    if draft_probs is None:
        parts = [u, p_x, torch.ones_like(p_x)]
    else:
        q = draft_probs.to(device)
        parts = [u, p_x, q[torch.arange(n, device=device), token_index].float()]
    after: dict[int, int] = {}  # a later sibling -> its first sibling's index in `firsts`
    if firsts:
        for f, first in enumerate(firsts):
            for c in children[parent_rows[first]][1:]:
                after[c] = f
        first_index = torch.tensor(firsts, dtype=torch.long, device=device)
        residual = (stacked[parent_index[first_index]] - q[first_index].float()).clamp_min(0.0)  # [F, V]
        later = list(after)
        parts += [
            residual.sum(dim=-1),
            residual[torch.tensor([after[c] for c in later], device=device), token_index[later]],
        ]
    values = torch.cat(parts).tolist()  # the one read
    uniforms, ps, qs = values[:n], values[n : 2 * n], values[2 * n : 3 * n]
    masses = values[3 * n : 3 * n + len(firsts)]
    behind = dict(zip(list(after), values[3 * n + len(firsts) :]))  # max(0, p(x) - q_first(x))
    if any(qs[c] != 1.0 for c in after):  # a later sibling that is not a point mass
        return None
    path: list[int] = []
    row, removed, rejected = 0, {}, None
    while True:
        removed, rejected, accepted = {}, None, None
        kids = children[row]
        for i, c in enumerate(kids):
            x = tokens[c]
            if draft_probs is not None and i == 0:  # a draw from q: p(x) / q(x)
                if qs[c] <= 0.0:
                    raise ValueError(f"node {c}'s token {x} has probability 0 under its draft distribution")
                if uniforms[c] < ps[c] / qs[c]:
                    accepted = c
                    break
                rejected = c
                continue
            if rejected is None:  # point masses against p
                rx = ps[c]
            else:  # point masses against the first child's residual
                mass = masses[after[c]]
                rx = behind[c] / mass if mass > 1e-12 else ps[c]
            left = 1.0 - sum(removed.values())
            if x not in removed and left > 0.0 and uniforms[c] < rx / left:
                accepted = c
                break
            removed.setdefault(x, rx)
        if accepted is None:
            break
        path.append(accepted)
        row = accepted + 1
    r = target_probs[row].float()
    if rejected is not None:
        r = _residual(r, tokens[rejected], draft_probs[rejected].to(r.device).float())
    if removed:
        r = r.clone()
        r[torch.tensor(list(removed), dtype=torch.long, device=r.device)] = 0.0
        r = r / r.sum()
    bonus = int(categorical(r, generator))  # the second read
    return TreeAcceptance(torch.tensor(path, dtype=torch.long, device="cpu"), bonus, tuple(path))


def _try_in_turn(kids, tokens, r, draft_probs, generator):
    """Try ``kids`` in node order, one uniform per child tried: ``(accepted child or None, residual)``."""
    device = r.device
    for c in kids:
        x = tokens[c]
        u = float(torch.rand((), generator=generator, device=device))
        if draft_probs is None:
            if u < float(r[x]):
                return c, r
            r = _residual(r, x, None)
        else:
            q = draft_probs[c].to(device).float()
            qx = float(q[x])
            if qx <= 0.0:
                raise ValueError(f"node {c}'s token {x} has probability 0 under its draft distribution")
            if u < float(r[x]) / qx:
                return c, r
            residual = (r - q).clamp_min(0.0)
            mass = residual.sum()
            if float(mass) > 1e-12:  # see _residual
                r = residual / mass
    return None, r


def _try_batched(kids, tokens, r, draft_probs, generator):
    """:func:`_try_in_turn` with one device read: the residual before each child (as if every earlier
    child was rejected, which is when that child is tried), one uniform per child, then the first child
    whose uniform falls below its acceptance probability."""
    if not kids:
        return None, r
    device = r.device
    residuals, hits, qxs = [r], [], []
    for c in kids:
        x = tokens[c]
        q = None if draft_probs is None else draft_probs[c].to(device).float()
        hits.append(residuals[-1][x])
        if q is not None:
            qxs.append(q[x])
        residuals.append(_residual(residuals[-1], x, q))
    u = torch.rand(len(kids), generator=generator, device=device)
    values = torch.stack([u, torch.stack(hits), torch.stack(qxs) if qxs else torch.ones_like(u)]).tolist()
    for i, (c, ui, rx, qx) in enumerate(zip(kids, *values)):
        if draft_probs is not None and qx <= 0.0:
            raise ValueError(f"node {c}'s token {tokens[c]} has probability 0 under its draft distribution")
        if ui < rx / qx:
            return c, residuals[i]
    return None, residuals[-1]
