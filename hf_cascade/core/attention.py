"""Tree attention inputs: the additive 4D mask and the position ids of a token tree.

The tree's ``n`` nodes follow ``prefix_len`` keys that every node may attend to (positions
``0 .. prefix_len - 1``, already in the KV cache). Node ``i`` sits at position
``prefix_len + depth[i]``, the position it has on its own branch, and attends to the prefix and to
its ancestors and itself (SpecInfer's tree attention, Miao et al., 2024, §4; Medusa, Cai et al.,
2024, §2.1.2; ReDrafter's dynamic tree attention, Cheng et al., 2024, §2). With a sliding window
``W`` (Gemma-style local layers) a node also needs ``pos(query) - pos(key) < W``, measured in
*positions*, not in indices of the linearized tree: transformers' ``sliding_window_overlay`` keeps
``kv_idx > q_idx - W``, and on a branch position and index coincide.

Verification builds its inputs here: :func:`row_inputs` for one row after a dense prefix (a dynamic cache's, or a
static cache's verified columns; a chain with the model's own causal mask, a tree with :func:`query_tree_mask`), or
:func:`batch_tree_allowed` over a batch's columns with holes; :func:`per_layer_type` gives each kind of attention
layer its mask (sliding windows applied by the mask). :func:`tree_queries` is :func:`row_inputs`' queries built
tensor by tensor, the reference it is tested against. :func:`tree_allowed`, :func:`tree_attention_mask` and
:func:`tree_position_ids` state the same attention densely over a tree's own nodes (give it the root with
:meth:`~.structure.TokenTree.with_root`): the public reference those are tested against.
"""

from __future__ import annotations

import torch

from ..placement import HOST, upload
from .closure import closure_bits, closure_matrix, unpack_closure
from .structure import TokenTree

_SLIDING = "sliding_attention"
_FULL = "full_attention"


def tree_allowed(prefix_len: int, tree: TokenTree, sliding_window: int | None = None) -> torch.Tensor:
    """``[n, prefix_len + n]`` bool: where node ``i`` (row) may attend (column = key index)."""
    if prefix_len < 0:
        raise ValueError(f"prefix_len must be >= 0, got {prefix_len}")
    n = tree.num_nodes
    device = tree.tokens.device
    allowed = torch.ones(n, prefix_len + n, dtype=torch.bool, device=device)
    allowed[:, prefix_len:] = tree.ancestor_mask()
    if sliding_window is not None:
        q_pos = prefix_len + tree.depth  # [n]
        k_pos = torch.cat([torch.arange(prefix_len, device=device), q_pos])  # [prefix_len + n]
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


def needs_tree_mask(tree: TokenTree) -> bool:
    """Whether verifying ``tree`` needs the custom tree mask: ``False`` for a chain (node ``i``'s parent is
    ``i - 1``; no nodes included), which plain causal attention at consecutive positions verifies on any
    attention backend. Read from the tree's host structure (no device read)."""
    parents = tree.parent_list if hasattr(tree, "parent_list") else tree.parents.tolist()
    return any(p != i - 1 for i, p in enumerate(parents))


def row_inputs(
    model,
    prefix_len: int,
    tree: TokenTree,
    root: int | torch.Tensor,
    where: tuple[torch.device, torch.dtype],
    queries: int | None = None,
    linear: bool = False,
    columns: int | None = None,
) -> dict:
    """One row's verification inputs: the queries ``[root, nodes, padding]`` (``queries`` of them, default the root
    and the nodes) written after a dense prefix of ``prefix_len`` columns, ``root`` at position ``prefix_len`` and
    node ``i`` at ``prefix_len + 1 + depth[i]``; ``columns``: the columns attention sees (a static cache's, with
    position ids always passed: the counter is on the device), ``None`` for a dynamic cache (the prefix and the
    queries). ``where``: the device and dtype of the model's inputs and masks.

    A chain (``linear``, or a tree of one path on a dynamic cache: :func:`needs_tree_mask`) runs under the model's own
    causal mask (padding queries repeat the root after every real query: none sees them); a tree under
    :func:`query_tree_mask` per kind of layer (:func:`per_layer_type`). Built from the tree's host structure and sent
    in one copy (:func:`~hf_cascade.placement.upload`): the ids, the positions and the closure's rows as bits
    (:func:`~hf_cascade.core.closure.closure_bits`), split on the device; a closure seen recently is kept on the
    device (shared with :func:`query_ancestors`). ``root``: a host int, or a one-element tensor written over the
    ids on the device (never read)."""
    device, n = where[0], tree.num_nodes
    queries = queries or n + 1
    chain = linear or (columns is None and not needs_tree_mask(tree))
    if chain and columns is None and (isinstance(root, torch.Tensor) or tree.host_tokens is None):
        root = torch.as_tensor(root, device=tree.tokens.device).long().reshape(1)  # a host int: no read
        return dict(input_ids=torch.cat([root, tree.tokens])[None].to(device))
    host_root = 0 if isinstance(root, torch.Tensor) else int(root)
    rows = [[host_root, *tree.token_list] + [host_root] * (queries - n - 1)]
    ancestors = None
    if chain and columns is not None:
        rows.append(list(range(prefix_len, prefix_len + queries)))
    elif not chain:
        rows.append([prefix_len] + [prefix_len + 1 + d for d in tree.depth_list] + [0] * (queries - n - 1))
        key = (tree.parent_list, queries, device)
        ancestors = _CLOSURES.get(key)
        bits = closure_bits((-1, *(p + 1 for p in tree.parent_list)), queries) if ancestors is None else None
        if bits is not None and queries <= 64:
            rows.append(bits)  # the root: every node's ancestor
    packed = upload(torch.tensor(rows, dtype=torch.long, device=HOST), device)  # the step's one copy
    inputs = dict(input_ids=packed[0:1])
    if isinstance(root, torch.Tensor):
        inputs["input_ids"][0, 0] = root.reshape(()).to(device=device, dtype=torch.long)
    if len(rows) > 1:
        inputs["position_ids"] = positions = packed[1:2]
    if chain:
        return inputs
    if ancestors is None:
        ancestors = unpack_closure(packed[2]).bool() if queries <= 64 else closure_matrix(bits, device)
        if len(_CLOSURES) >= 512:
            _CLOSURES.clear()
        _CLOSURES[key] = ancestors
    width = columns or prefix_len + queries
    inputs["attention_mask"] = per_layer_type(
        model, lambda window: query_tree_mask(prefix_len, n + 1, positions, ancestors, width, where[1], window)
    )
    return inputs


def per_layer_type(model, build):
    """``build(sliding_window)`` (``None``: full attention) for each kind of attention layer ``model`` has:
    one mask, or a dict ``{layer_type: mask}`` when it mixes full and sliding-window layers."""
    kinds = _layer_kinds(model.config)
    masks = {kind: build(window) for kind, window in kinds.items()}
    return masks if len(masks) > 1 else next(iter(masks.values()))


_KINDS: dict[int, tuple] = {}  # id(config) -> (config, its layer kinds): read once per config, not per step


def _layer_kinds(config) -> dict[str, int | None]:
    """``{layer_type: sliding window or None}`` of the kinds of attention layers ``config`` describes (one kind,
    ``_FULL``, when it names none)."""
    known = _KINDS.get(id(config))
    if known is not None and known[0] is config:
        return known[1]
    text = config.get_text_config()
    window = getattr(text, "sliding_window", None)
    layer_types = getattr(text, "layer_types", None)
    if layer_types:
        unknown = set(layer_types) - {_FULL, _SLIDING}
        if unknown:
            raise NotImplementedError(
                f"tree verification supports full and sliding-window attention layers, not {sorted(unknown)}"
            )
        kinds = {kind: (window if kind == _SLIDING else None) for kind in sorted(set(layer_types))}
    elif window is not None and getattr(text, "use_sliding_window", True):
        kinds = {_SLIDING: window}  # every layer windowed (Mistral-style)
    else:
        kinds = {_FULL: None}
    if len(_KINDS) > 64:
        _KINDS.clear()
    _KINDS[id(config)] = (config, kinds)
    return kinds


def tree_queries(
    prefix_len: int, root: int | torch.Tensor, tree: TokenTree, queries: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
    positions = torch.tensor(
        [[prefix_len] + [prefix_len + 1 + d for d in tree.depth_list] + [0] * pad], dtype=torch.long, device=device
    )
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
    closure = closure_matrix(closure_bits((-1, *(p + 1 for p in parents)), queries), device)  # root: all's ancestor
    if len(_CLOSURES) >= 512:
        _CLOSURES.clear()
    _CLOSURES[key] = closure
    return closure


_CLOSURES: dict[tuple, torch.Tensor] = {}  # (parents, queries, device) -> query_ancestors' closure


def query_tree_mask(
    prefix_len: int,
    real: int,
    positions: torch.Tensor,
    ancestors: torch.Tensor,
    columns: int,
    dtype: torch.dtype,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Additive ``[1, 1, Q, columns]`` mask of the queries of :func:`tree_queries` (the first ``real`` of them the
    root and the nodes, the rest padding), written at columns ``prefix_len ..`` after a dense prefix: a real query
    attends to the prefix and to its ancestors and itself, a padding query to itself only, nothing attends to the
    columns past the queries; with ``sliding_window`` ``W``, only to keys fewer than ``W`` positions behind it.
    Built in place over a filled tensor (the same values as :func:`batch_tree_allowed` and :func:`additive`); where
    every query is real and the mask spans exactly the prefix and the queries (the eager verification's), as the
    prefix's zeros beside the queries' block of a structure seen recently (shared: read it, never write it)."""
    queries = ancestors.shape[0]
    if sliding_window is None and real == queries and columns == prefix_len + queries:
        block = _tree_block(ancestors, dtype)  # [Q, Q]
        return torch.cat([block.new_zeros(queries, prefix_len), block], dim=1).view(1, 1, queries, columns)
    low = torch.finfo(dtype).min
    mask = torch.full((1, 1, queries, columns), low, dtype=dtype, device=ancestors.device)
    mask[0, 0, :real, :prefix_len] = 0.0
    mask[0, 0, :, prefix_len : prefix_len + queries].masked_fill_(ancestors, 0.0)
    if sliding_window is not None:
        query_pos = positions[0]
        keys = torch.cat([torch.arange(prefix_len, device=query_pos.device), query_pos])  # [prefix_len + Q]
        far = (query_pos[:, None] - keys[None, :]) >= sliding_window
        mask[0, 0, :, : prefix_len + queries].masked_fill_(far, low)
    return mask


def _tree_block(ancestors: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive ``[Q, Q]`` block of :func:`query_tree_mask` over the queries' own columns: ``0`` where a query
    sees its ancestors and itself, ``finfo(dtype).min`` elsewhere; made once per closure tensor (those of
    :func:`query_ancestors` are shared between steps) and dtype."""
    key = (ancestors, dtype)  # the tensor itself (hashed by identity, kept alive by the key)
    block = _BLOCKS.get(key)
    if block is None:
        block = torch.full(ancestors.shape, torch.finfo(dtype).min, dtype=dtype, device=ancestors.device)
        block.masked_fill_(ancestors, 0.0)
        if len(_BLOCKS) >= 512:
            _BLOCKS.clear()
        _BLOCKS[key] = block
    return block


_BLOCKS: dict[tuple, torch.Tensor] = {}  # (closure tensor, dtype) -> _tree_block's block


def batch_tree_allowed(
    past_pos: torch.Tensor, query_pos: torch.Tensor, ancestors: torch.Tensor, sliding_window: int | None = None
) -> torch.Tensor:
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
    real = query_pos >= 0  # [B, N]
    past = (past_pos >= 0)[:, None, :] & real[:, :, None]  # [B, N, T]
    allowed = torch.cat([past, ancestors.to(torch.bool)], dim=-1)
    if sliding_window is not None:
        keys = torch.cat([past_pos, query_pos], dim=-1)  # [B, T + N]
        allowed &= (query_pos[:, :, None] - keys[:, None, :]) < sliding_window
    return allowed


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``allowed`` (bool) as an additive mask with a head axis: ``0`` where attending, ``finfo(dtype).min``
    elsewhere (the format of transformers' eager/sdpa 4D masks)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.unsqueeze(-3)
