"""ReDrafter's beam search over the recurrent draft head, and the two ways to lay its beams out for
verification: packed into a prefix tree (dynamic tree attention, §2 and Listing 1: :func:`get_prefix_match` finds the
beams' shared prefixes, :func:`unpack` maps per-node results back to beams; the tree itself is built on the host by
:func:`~hf_cascade.core.structure.prefix_tree`, :func:`pack`) or as separate branches (:func:`flat_tree`).

Cheng et al. (2024), "Recurrent Drafter for Fast Speculative Decoding in Large Language Models",
Section 2 ("Beam search", "Dynamic tree attention after beam search"); the procedure is the one of
the reference implementation (``apple/ml-recurrent-drafter``, ``Drafter.beam_search_candidates``):

* every beam starts with the token the target itself produced from its last hidden state ``x`` (the
  tree's root, ``seq[-1]``), and the RNN state ``s_0 = 0``;
* step ``k`` updates each live beam's state with the target embedding of its last token,
  ``s_k = f(U s_{k-1} + W e_k + b)``, scores every next token with ``log softmax(LMHead([x, s_k]))``
  and keeps the ``w`` best (beam, token) pairs by the beam's summed log-probability.

Deviations from the reference (none changes which beams are kept when ``w <= N``):

* the first step expands the single root beam instead of ``w`` copies of it scored ``[0, -50000, ...]``
  (the same top-``w`` choice without a sentinel value);
* scores are the plain log-softmax over the head's ``N`` output columns (the reference first keeps
  only the top 50 logits of each step; with a reduced vocabulary the softmax is over that subset);
* ``length`` counts *draft* tokens: the reference's ``BeamShape(width, length)`` counts the root too,
  so its ``length = L + 1``.

The search is a deterministic function of the context (no sampling), so its tree is verified with
``draft_probs = None`` (:func:`hf_cascade.core.accept.sampling_tree_accept`'s point-mass case: lossless).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..core.structure import TokenTree, prefix_tree


@torch.no_grad()
def beam_search(
    head,
    hidden: torch.Tensor,
    root: int | torch.Tensor,
    embed: Callable[[torch.Tensor], torch.Tensor],
    width: int,
    length: int,
    token_logp: bool = False,
    device_dtype: tuple[torch.device, torch.dtype] | None = None,
) -> tuple[torch.Tensor, ...]:
    """Beam-search ``length`` draft tokens after ``root`` with a ReDrafter head.

    Args:
        head: a :class:`~hf_cascade.heads.ReDrafterModel` (its ``init_state`` / ``step`` / ``logits``).
        hidden: ``[H]`` the target's last hidden state ``x`` (the one that produced ``root``).
        root: the target's token produced from ``x`` (the first token of every beam, not returned).
        embed: target token ids ``[b]`` -> their target input embeddings ``[b, H]``.
        width: ``w``, beams kept after each step (fewer when the head has fewer candidates).
        length: ``L >= 1``, draft tokens per beam.
        token_logp: also return each beam token's conditional log-probability.
        device_dtype: the head's ``(device, floating dtype)`` when the caller knows them (default: read from its
            parameters).

    Returns:
        ``(beams, scores)``: ``beams`` ``[w', L]`` target token ids, best beam first
        (``w' = min(w, N ** L)``); ``scores`` ``[w']`` their summed log-probabilities under the head.
        With ``token_logp``: ``(beams, scores, logp)``, ``logp`` ``[w', L]`` the log-probability of
        ``beams[i, j]`` given ``beams[i, :j]`` (``logp.sum(-1) == scores``).
    """
    if width < 1 or length < 1:
        raise ValueError(f"beam search needs width >= 1 and length >= 1, got width={width}, length={length}")
    device, dtype = head_device_dtype(head) if device_dtype is None else device_dtype
    x = hidden.reshape(1, -1).to(device=device, dtype=dtype)  # [1, H]
    last = torch.as_tensor(root, device=device).reshape(1).long()  # [b = 1]
    state = head.init_state(x)  # [1, H] (s_0 = 0)
    score = torch.zeros(1, device=device, dtype=torch.float32)  # [b]
    kept: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # per step: beam, token, logp
    for _ in range(length):
        state = head.step(state, embed(last).to(device=device, dtype=dtype))  # [b, H]
        logp = head.logits(state, x, full_vocab=False).float().log_softmax(dim=-1)  # [b, N]
        n_cols = logp.shape[-1]
        total = (score[:, None] + logp).flatten()  # [b * N]
        score, flat = total.topk(min(width, total.numel()))  # [b'] best first
        beam, col = torch.floor_divide(flat, n_cols), flat % n_cols  # (``//`` without its wrapper)
        last = head.to_target_ids(col).to(device)  # [b'] target ids
        kept.append((beam, last, logp.take(flat)))  # the kept beams' parents
        state = state.index_select(0, beam)  # [b', H]
    beams, steps = _backtrack(kept)
    return (beams, score, steps) if token_logp else (beams, score)


def _backtrack(kept: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The final beams' tokens and log-probabilities (``[w', L]`` each) from each step's kept ``(beam, token,
    logp)``: ``beam`` indexes the previous step's beams, followed back from the last step."""
    beam, tokens, logps = kept[-1]
    tokens, logps = [tokens], [logps]
    for parent, token, logp in reversed(kept[:-1]):  # (index_select: x[beam], a
        tokens.append(token.index_select(0, beam))  # lighter call)
        logps.append(logp.index_select(0, beam))
        beam = parent.index_select(0, beam)
    return torch.stack(tokens[::-1], dim=1), torch.stack(logps[::-1], dim=1)


def get_prefix_match(beams: torch.Tensor) -> torch.Tensor:
    """ReDrafter Listing 1 (Cheng et al., 2024): ``[w, L] -> [w, L]``.

    ``prefix_match[i, j] = k``: ``k`` is the smallest beam index with ``beams[k, :j + 1] ==
    beams[i, :j + 1]`` (so ``k <= i``). Paper example::

        beams = [[91, 92, 93, 95],         prefix_match = [[0, 0, 0, 0],
                 [91, 92, 94, 96],                         [0, 0, 1, 1],
                 [91, 92, 93, 97]]                         [0, 0, 0, 2]]

    Same steps as the listing: token matches between beams, ``cumsum`` along positions equal to
    ``1..L`` marks matching prefixes, ``argmax`` over the other beam picks the first one. (The
    listing's broadcast ``beams[:, :, None] == beams[:, None, :]`` is written for a batched
    ``[b, w, L]`` input, as in the reference ``_dedup_prefix``; for ``[w, L]`` the pairwise beam
    comparison is ``beams[:, None, :] == beams[None, :, :]``.)
    """
    beams = torch.as_tensor(beams)
    if beams.ndim != 2:
        raise ValueError(f"beams must be [w, L], got shape {tuple(beams.shape)}")
    L = beams.shape[1]
    beam_index = torch.arange(1, L + 1, device=beams.device)
    matches = beams[:, None, :] == beams[None, :, :]  # [w, w, L]
    seq_matches = torch.cumsum(matches.long(), dim=2) == beam_index[None, None, :]  # [w, w, L]
    # torch.argmax returns the first maximal index: the smallest beam sharing the prefix.
    return torch.argmax(seq_matches.long(), dim=1)  # [w, L]


def unpack(node_values: torch.Tensor, beam_to_node: torch.Tensor) -> torch.Tensor:
    """Per-node results ``[n, ...]`` back to the beams' layout ``[w, L, ...]`` (ReDrafter's
    ``unpack``): ``out[i, j] = node_values[beam_to_node[i, j]]``."""
    return node_values[beam_to_node.to(node_values.device)]


def beam_rows(width: int, length: int, columns: int) -> list[int]:
    """Rows (live beams) the head runs at each of the ``length`` steps of :func:`beam_search`: one at the
    first step (the root beam), then ``min(width, rows * columns)`` (``columns``: the head's output
    columns ``N``), as its ``topk`` keeps them."""
    rows, live = [], 1
    for _ in range(length):
        rows.append(live)
        live = min(width, live * columns)
    return rows


def flat_tree(beams: torch.Tensor) -> TokenTree:
    """The ``w`` beams (``[w, L]``) as ``w`` separate branches of ``L`` nodes below the root, no
    prefix shared: node ``i * L + j`` holds ``beams[i, j]`` (what verifying the beams without dynamic
    tree attention computes, ``w * L`` tokens)."""
    beams = torch.as_tensor(beams).long()
    if beams.ndim != 2 or beams.shape[0] == 0:
        raise ValueError(f"beams must be [w, L] with w >= 1, got shape {tuple(beams.shape)}")
    w, L = beams.shape
    host = [-1 if i % L == 0 else i - 1 for i in range(w * L)]  # the structure, on the host
    return TokenTree(beams.flatten(), torch.tensor(host, dtype=torch.long, device=beams.device), host_parents=host)


def read_beams(beams: torch.Tensor, logp: torch.Tensor) -> tuple[list[list[int]], list[list[float]]]:
    """``beams`` (``[w, L]`` ids) and the probabilities ``exp(logp)`` (``[w, L]``) as host lists, in one read
    (ids are exact in float64)."""
    w = beams.shape[0]
    rows = torch.cat([beams.double(), logp.double().exp().to(beams.device)]).tolist()  # [2w, L]
    return [list(map(int, row)) for row in rows[:w]], rows[w:]


def pack(
    beams: torch.Tensor, dedupe: bool = True, rows: list[list[int]] | None = None
) -> tuple[TokenTree, list[list[int]]]:
    """The verification tree of ``beams`` (``[w, L]``) and, on the host, the node of each beam token:
    the packed prefix tree (:func:`~hf_cascade.core.structure.prefix_tree`, one read of the beams, none when
    ``rows`` is their host copy: beam token ``(i, j)`` opens a node iff ``get_prefix_match(beams)[i, j] == i``, nodes
    numbered beam-major as the reference's ``pack``) or :func:`flat_tree` (no read)."""
    if dedupe:
        tree, _, beam_to_node = prefix_tree(beams, rows)
        return tree, beam_to_node
    tree = flat_tree(beams)
    w, L = beams.shape
    return tree, [[i * L + j for j in range(L)] for i in range(w)]


def prune(tree: TokenTree, beam_to_node: list[list[int]], keep: torch.Tensor) -> TokenTree:
    """Keep the nodes of the beam tokens where ``keep`` (``[w, L]`` bool, each row a prefix: ``True``
    then ``False``) is true; a shared node stays when any beam through it keeps it. One read of ``keep``."""
    return tree.select(kept_nodes(tree, beam_to_node, keep))


def node_probabilities(tree: TokenTree, beam_to_node: list[list[int]], logp: torch.Tensor) -> list[float]:
    """``[n]`` host floats: each node's conditional probability under the head (beam tokens that share a node
    share their prefix, hence their probability). One read of ``logp`` (``[w, L]``), none when it is given as
    host rows of probabilities (:func:`read_beams`)."""
    probs = [0.0] * tree.num_nodes
    rows = logp.float().exp().tolist() if isinstance(logp, torch.Tensor) else logp  # host probabilities: no read
    for row, nodes in zip(rows, beam_to_node):
        for p, node in zip(row, nodes):
            probs[node] = p
    return probs


def kept_nodes(tree: TokenTree, beam_to_node: list[list[int]], keep: torch.Tensor) -> list[bool]:
    """:func:`prune`'s node mask (host list)."""
    rows = keep.bool().tolist()
    if (
        len(rows) != len(beam_to_node)
        or any(len(r) != len(b) for r, b in zip(rows, beam_to_node))
        or any(not a and b for r in rows for a, b in zip(r, r[1:]))
    ):
        raise ValueError("keep must be a [w, L] mask whose rows are prefixes (True..., then False...)")
    nodes = [False] * tree.num_nodes
    for r, b in zip(rows, beam_to_node):
        for k, node in zip(r, b):
            if k:
                nodes[node] = True
    return nodes


def beams_tree(beams: torch.Tensor, dedupe: bool = True, keep: torch.Tensor | None = None) -> TokenTree:
    """The verification tree of ``beams`` (``[w, L]``): the packed prefix tree (dynamic tree
    attention, :func:`~hf_cascade.core.structure.prefix_tree`) or, with ``dedupe=False``, :func:`flat_tree`.

    ``keep`` (``[w, L]`` bool, each row a prefix: ``True`` then ``False``) drops the beam tokens
    where it is ``False``; a shared node stays when any beam through it keeps it."""
    tree, beam_to_node = pack(beams, dedupe)
    return tree if keep is None else prune(tree, beam_to_node, keep)


def confident_prefix(logp: torch.Tensor, min_confidence: float) -> torch.Tensor:
    """``[w, L]`` bool: beam token ``(i, j)`` is kept iff it and every earlier token of beam ``i``
    had a conditional probability ``>= min_confidence`` under the head (``logp``: ``[w, L]``)."""
    ok = logp.exp() >= min_confidence  # [w, L]
    return ok.long().cumprod(dim=1).bool()


def head_device_dtype(head) -> tuple[torch.device, torch.dtype]:
    """The head's device and floating dtype from its first floating parameter (``PreTrainedModel.dtype`` and
    ``.device`` walk every parameter: a cost per draft)."""
    for p in head.parameters():
        if p.is_floating_point():
            return p.device, p.dtype
    return head.device, head.dtype


__all__ = [
    "beam_rows",
    "beam_search",
    "beams_tree",
    "confident_prefix",
    "flat_tree",
    "get_prefix_match",
    "head_device_dtype",
    "kept_nodes",
    "node_probabilities",
    "pack",
    "prune",
    "read_beams",
    "unpack",
]
