"""Tree attention inputs: the additive 4D mask and the position ids of a token tree.

The tree's ``n`` nodes follow ``prefix_len`` keys that every node may attend to (positions
``0 .. prefix_len - 1``, already in the KV cache). Node ``i`` sits at position
``prefix_len + depth[i]``, the position it has on its own branch, and attends to the prefix and to
its ancestors and itself (SpecInfer's tree attention, Miao et al., 2024, §4; Medusa, Cai et al.,
2024, §2.1.2; ReDrafter's dynamic tree attention, Cheng et al., 2024, §2). With a sliding window
``W`` (Gemma-style local layers) a node also needs ``pos(query) - pos(key) < W``, measured in
*positions*, not in indices of the linearized tree: transformers' ``sliding_window_overlay`` keeps
``kv_idx > q_idx - W``, and on a branch position and index coincide.

Verification builds its inputs with :func:`tree_queries` and :func:`query_tree_mask` (one tree) or
:func:`batch_tree_allowed` (a batch). :func:`tree_allowed`, :func:`tree_attention_mask` and
:func:`tree_position_ids` state the same attention densely over a tree's own nodes (give it the root with
:meth:`~.structure.TokenTree.with_root`): the public reference those are tested against.
"""

from __future__ import annotations

import torch

from .closure import closure_bits, unpack_closure
from .structure import TokenTree


def tree_allowed(prefix_len: int, tree: TokenTree, sliding_window: int | None = None) -> torch.Tensor:
    """``[n, prefix_len + n]`` bool: where node ``i`` (row) may attend (column = key index)."""
    if prefix_len < 0:
        raise ValueError(f"prefix_len must be >= 0, got {prefix_len}")
    n = tree.num_nodes
    device = tree.tokens.device
    allowed = torch.ones(n, prefix_len + n, dtype=torch.bool, device=device)
    allowed[:, prefix_len:] = tree.ancestor_mask()
    if sliding_window is not None:
        q_pos = prefix_len + tree.depth                                              # [n]
        k_pos = torch.cat([torch.arange(prefix_len, device=device), q_pos])           # [prefix_len + n]
        allowed &= (q_pos[:, None] - k_pos[None, :]) < sliding_window
    return allowed


def tree_attention_mask(
    prefix_len: int,
    tree: TokenTree,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Additive mask ``[1, 1, n, prefix_len + n]``: ``0`` where attending, ``finfo(dtype).min``
    elsewhere (the format of transformers' eager/sdpa 4D masks). ``sliding_window``: also mask keys
    ``W`` or more positions behind the query."""
    allowed = tree_allowed(prefix_len, tree, sliding_window)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device) if device is not None else mask[None, None]


def tree_position_ids(prefix_len: int, tree: TokenTree) -> torch.Tensor:
    """``[1, n]`` LongTensor: ``prefix_len + depth[i]``."""
    return (prefix_len + tree.position_offsets())[None]


def tree_queries(prefix_len: int, root: int | torch.Tensor, tree: TokenTree, queries: int,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The queries ``[root, nodes, padding]`` of one tree's verification, from its host structure: ``input_ids``
    ``[1, Q]`` (padding repeats the root), ``position_ids`` ``[1, Q]`` (the root at ``prefix_len``, node ``i`` at
    ``prefix_len + 1 + depth[i]``, padding at 0) and their closure (:func:`query_ancestors`), in three copies.
    ``root``: a host int, or a one-element tensor, joined to the nodes' ids on ``device`` (never read)."""
    n = tree.num_nodes
    pad = queries - n - 1
    if isinstance(root, torch.Tensor):
        root = root.reshape(1).to(device=device, dtype=torch.long)
        ids = torch.cat([root, tree.tokens.to(device), root.expand(pad)])[None]
    else:
        ids = torch.tensor([[root, *tree.token_list] + [root] * pad], dtype=torch.long, device=device)
    positions = torch.tensor([[prefix_len] + [prefix_len + 1 + d for d in tree.depth_list] + [0] * pad],
                             dtype=torch.long, device=device)
    return ids, positions, query_ancestors(tree.parent_list, queries, device)


def query_ancestors(parents: tuple[int, ...], queries: int, device: torch.device) -> torch.Tensor:
    """``[Q, Q]`` bool over the queries ``[root, nodes, padding]``: each query's ancestors and itself (the root is
    every node's ancestor; a padding query sees itself only). Up to 64 queries: each row's bits as one host int,
    unpacked on the device (one copy); more, row by row. The closure of a structure seen recently is shared (trees
    repeat their shapes from step to step): read it, never write it."""
    key = (parents, queries, device)
    known = _CLOSURES.get(key)
    if known is not None:
        return known
    rows = closure_bits((-1, *(p + 1 for p in parents)), queries)      # the root: every node's ancestor
    if queries <= 64:
        closure = unpack_closure(torch.tensor(rows, dtype=torch.long, device=device)).bool()
    else:
        closure = torch.tensor([[(b >> j) & 1 for j in range(queries)] for b in rows], dtype=torch.bool, device=device)
    if len(_CLOSURES) >= 512:
        _CLOSURES.clear()
    _CLOSURES[key] = closure
    return closure


_CLOSURES: dict[tuple, torch.Tensor] = {}       # (parents, queries, device) -> query_ancestors' closure


def query_tree_mask(prefix_len: int, real: int, positions: torch.Tensor, ancestors: torch.Tensor, columns: int,
                    dtype: torch.dtype, sliding_window: int | None = None) -> torch.Tensor:
    """Additive ``[1, 1, Q, columns]`` mask of the queries of :func:`tree_queries` (the first ``real`` of them the
    root and the nodes, the rest padding), written at columns ``prefix_len ..`` after a dense prefix: a real query
    attends to the prefix and to its ancestors and itself, a padding query to itself only, nothing attends to the
    columns past the queries; with ``sliding_window`` ``W``, only to keys fewer than ``W`` positions behind it.
    Built in place over a filled tensor (the same values as :func:`batch_tree_allowed` and :func:`additive`); where
    every query is real and the mask spans exactly the prefix and the queries (the eager verification's), as the
    prefix's zeros beside the queries' block of a structure seen recently (shared: read it, never write it)."""
    queries = ancestors.shape[0]
    if sliding_window is None and real == queries and columns == prefix_len + queries:
        block = _tree_block(ancestors, dtype)                                                   # [Q, Q]
        return torch.cat([block.new_zeros(queries, prefix_len), block], dim=1).view(1, 1, queries, columns)
    low = torch.finfo(dtype).min
    mask = torch.full((1, 1, queries, columns), low, dtype=dtype, device=ancestors.device)
    mask[0, 0, :real, :prefix_len] = 0.0
    mask[0, 0, :, prefix_len:prefix_len + queries].masked_fill_(ancestors, 0.0)
    if sliding_window is not None:
        query_pos = positions[0]
        keys = torch.cat([torch.arange(prefix_len, device=query_pos.device), query_pos])      # [prefix_len + Q]
        far = (query_pos[:, None] - keys[None, :]) >= sliding_window
        mask[0, 0, :, :prefix_len + queries].masked_fill_(far, low)
    return mask


def _tree_block(ancestors: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive ``[Q, Q]`` block of :func:`query_tree_mask` over the queries' own columns: ``0`` where a query
    sees its ancestors and itself, ``finfo(dtype).min`` elsewhere; made once per closure tensor (those of
    :func:`query_ancestors` are shared between steps) and dtype."""
    key = (ancestors, dtype)                       # the tensor itself (hashed by identity, kept alive by the key)
    block = _BLOCKS.get(key)
    if block is None:
        block = torch.full(ancestors.shape, torch.finfo(dtype).min, dtype=dtype, device=ancestors.device)
        block.masked_fill_(ancestors, 0.0)
        if len(_BLOCKS) >= 512:
            _BLOCKS.clear()
        _BLOCKS[key] = block
    return block


_BLOCKS: dict[tuple, torch.Tensor] = {}         # (closure tensor, dtype) -> _tree_block's block


def batch_tree_allowed(past_pos: torch.Tensor, query_pos: torch.Tensor, ancestors: torch.Tensor,
                       sliding_window: int | None = None) -> torch.Tensor:
    """``[B, N, T + N]`` bool: where each query of a batch of trees may attend, with holes in the cache.

    Args:
        past_pos: ``[B, T]`` the position of each cached column of each row, ``-1`` for a column the row
            does not own (left padding, or a rejected draft's hole).
        query_pos: ``[B, N]`` the position of each query (row ``b``'s root and tree nodes, then ``-1`` for
            the padding that evens the rows' tree sizes).
        ancestors: ``[B, N, N]`` bool, ``ancestors[b, i, j]`` iff query ``j`` is query ``i`` or one of its
            ancestors (a padding query: itself only, so its row of scores is never empty).

    A query attends to every column its row owns and to its ancestors; with ``sliding_window`` ``W`` only to
    keys fewer than ``W`` positions behind it (positions, not columns: holes do not count)."""
    real = query_pos >= 0                                                           # [B, N]
    past = (past_pos >= 0)[:, None, :] & real[:, :, None]                           # [B, N, T]
    allowed = torch.cat([past, ancestors.to(torch.bool)], dim=-1)
    if sliding_window is not None:
        keys = torch.cat([past_pos, query_pos], dim=-1)                             # [B, T + N]
        allowed &= (query_pos[:, :, None] - keys[:, None, :]) < sliding_window
    return allowed


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``allowed`` (bool) as an additive mask with a head axis: ``0`` where attending, ``finfo(dtype).min``
    elsewhere (the format of transformers' eager/sdpa 4D masks)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.unsqueeze(-3)
