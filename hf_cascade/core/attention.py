"""Tree attention inputs: the additive 4D mask and the position ids of a token tree.

The tree's ``n`` nodes follow ``prefix_len`` keys that every node may attend to (positions
``0 .. prefix_len - 1``, already in the KV cache). Node ``i`` sits at position
``prefix_len + depth[i]``, the position it has on its own branch, and attends to the prefix and to
its ancestors and itself (SpecInfer's tree attention, Miao et al., 2024, §4; Medusa, Cai et al.,
2024, §2.1.2; ReDrafter's dynamic tree attention, Cheng et al., 2024, §2). With a sliding window
``W`` (Gemma-style local layers) a node also needs ``pos(query) - pos(key) < W``, measured in
*positions*, not in indices of the linearized tree: transformers' ``sliding_window_overlay`` keeps
``kv_idx > q_idx - W``, and on a branch position and index coincide.
"""

from __future__ import annotations

import torch

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
    if prefix_len < 0:
        raise ValueError(f"prefix_len must be >= 0, got {prefix_len}")
    positions = prefix_len + tree.depth if sliding_window is not None else None
    mask = closure_mask(prefix_len, tree.ancestor_mask().logical_not(), positions, dtype, sliding_window)
    return mask.to(device) if device is not None else mask


def closure_mask(prefix_len: int, hidden: torch.Tensor, positions: torch.Tensor | None, dtype: torch.dtype,
                 sliding_window: int | None = None) -> torch.Tensor:
    """:func:`tree_attention_mask` of a tree given by ``hidden`` (``[n, n]`` bool: ``True`` where key node ``j``
    is neither node ``i`` nor one of its ancestors), on its device; ``positions``: ``[n]`` the nodes' positions
    (read only with ``sliding_window``)."""
    n = hidden.shape[0]
    mask = torch.zeros(n, prefix_len + n, dtype=dtype, device=hidden.device)
    if sliding_window is None:
        mask[:, prefix_len:].masked_fill_(hidden, torch.finfo(dtype).min)
        return mask[None, None]
    keys = torch.cat([torch.arange(prefix_len, device=hidden.device), positions])    # [prefix_len + n]
    far = (positions[:, None] - keys[None, :]) >= sliding_window
    far[:, prefix_len:] |= hidden
    return mask.masked_fill_(far, torch.finfo(dtype).min)[None, None]


def tree_position_ids(prefix_len: int, tree: TokenTree) -> torch.Tensor:
    """``[1, n]`` LongTensor: ``prefix_len + depth[i]``."""
    return (prefix_len + tree.position_offsets())[None]


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
