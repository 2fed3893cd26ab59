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
    allowed = tree_allowed(prefix_len, tree, sliding_window)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device) if device is not None else mask[None, None]


def tree_position_ids(prefix_len: int, tree: TokenTree) -> torch.Tensor:
    """``[1, n]`` LongTensor: ``prefix_len + depth[i]``."""
    return (prefix_len + tree.position_offsets())[None]
