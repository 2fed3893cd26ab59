"""The ancestor closure of a token tree, as bits per row.

Tree attention lets each node see exactly its ancestors and itself (SpecInfer's tree attention, Miao et al.,
2024, §4): the reflexive, transitive closure of the parent relation. With parents before children, node ``i``'s
row of that closure is its parent's row plus bit ``i``, so one pass over the host parent list gives every row as
one Python int (bit ``j``: node ``j`` is visible). Up to 64 rows fit int64 values: the rows reach the device in
one copy and :func:`unpack_closure` spreads them into an ``[n, n]`` matrix there. :class:`~.structure.TokenTree`
builds its :meth:`~.structure.TokenTree.ancestor_mask` from them, and :func:`~.attention.query_ancestors` the
closure of the verification queries (root, nodes, padding).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def closure_bits(parents: Sequence[int], width: int | None = None) -> list[int]:
    """Each node's ancestors and itself as the bits of one host int (bit ``j``: node ``j``); ``parents`` as
    :attr:`~.structure.TokenTree.parent_list` (parents first); ``width``: that many rows, those past the tree
    (padding) seeing themselves only. Up to 64 rows, as int64 values (bit 63 is the sign): one tensor copy."""
    bits: list[int] = []
    for i, p in enumerate(parents):
        bits.append((bits[p] if p >= 0 else 0) | (1 << i))
    bits += [1 << j for j in range(len(bits), width or 0)]
    return [b - (1 << 64) if b >= 1 << 63 else b for b in bits] if len(bits) <= 64 else bits


def unpack_closure(packed: torch.Tensor) -> torch.Tensor:
    """``[n, n]`` int64 of 0 and 1 from ``n <= 64`` rows of :func:`closure_bits` (on their device)."""
    n = packed.shape[-1]
    return (packed[:, None] >> _shifts(packed.device)[:n]).bitwise_and_(1)


def closure_matrix(bits: list[int], device: torch.device) -> torch.Tensor:
    """``[n, n]`` bool from :func:`closure_bits`' rows: unpacked on ``device`` up to 64 rows (one copy), row by row on
    the host past them (the bits no longer fit an int64)."""
    n = len(bits)
    if n <= 64:
        return unpack_closure(torch.tensor(bits, dtype=torch.long, device=device)).bool()
    return torch.tensor([[(b >> j) & 1 for j in range(n)] for b in bits], dtype=torch.bool, device=device)


_SHIFTS: dict[torch.device, torch.Tensor] = {}


def _shifts(device: torch.device) -> torch.Tensor:
    """``arange(64)`` on ``device`` (made once per device: the ancestor bits' positions)."""
    shifts = _SHIFTS.get(device)
    if shifts is None:
        shifts = _SHIFTS[device] = torch.arange(64, device=device)
    return shifts
