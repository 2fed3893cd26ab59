"""Row selection: the target's logits at a verified draft's nodes, computed only where acceptance looks.

Verifying an ``n``-node draft makes the target produce ``n + 1`` rows of logits (the root, then each
node), but acceptance reads only the rows on the path it walks: the root, each accepted node, and
(greedy, with duplicate sibling tokens; sampling, after a rejection) the few siblings it also tries.
With a large vocabulary the output head dominates the cost of those rows, and every head call reads
the whole head weight, so the rule is: compute a row when acceptance first reads it, together with
the rows it will most likely read next, in one head call of at most ``block_rows`` rows.

:class:`TreeRows` holds the target's final hidden states ``[n + 1, H]`` (the output head's input).
A missing row is computed with the next rows of its *first-child chain* (its first child, that
child's first child, ...: the drafter's main path, which linear drafts, CAPE and beam search put
first); a chain shorter than ``block_rows`` is completed with the rows a walk leaving it reads next
(children of the rows computed, in node order: CAPE's expansion siblings, the next beams). A walk
that stays on the main path costs one head call per ``block_rows`` rows it reads. ``block_rows``
comes from the verification session (:mod:`hf_cascade.backends`): calibrated by the CPU backend,
a small block on CPU without it, every row at once on accelerators, where rows are nearly free next
to a pass over the weight. Measurements: ``docs/``.

Logits processors also run only on the rows that are read (``input_ids`` = the sequence up to that
row's node, as plain decoding would have it). Rows are read in float32 on the sequence's device (the target's
input embeddings'), where transformers' own loops keep their scores: under ``device_map`` the output head may
live on another device, and processors index the logits with the ids. A head call's rows stay on the head's
device as it returned them until something reads one of them in full (a processor, sampling, :meth:`TreeRows.raw`,
``rows[r]``): then the call's rows cross in one device-to-device copy. Greedy acceptance without processors reads
only argmaxes: they are taken on the head's device (``torch.argmax`` of the same float32 values, the same ties) and
only the ids cross, in the host read acceptance makes anyway (a ``[k, V]`` float32 block is 1 MB a row at
``V = 262k``). The same class wraps precomputed logits (``raw=[n + 1, V]``, kept the same way), for targets whose
head the core does not reproduce (see :func:`~hf_cascade.core.forward.output_head`).

Rows are computed from the same hidden states with the same head and dtype as the model's own
forward, so greedy acceptance is unchanged (up to the float accumulation order a different number
of rows already implies in any batched forward).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from transformers import LogitsProcessorList

from ..placement import HOST, upload
from .structure import TokenTree

HeadFn = Callable[[torch.Tensor], torch.Tensor]  # [k, H] hidden -> [k, V] raw logits


class TreeRows:
    """Processed logits of rows ``0 .. n`` of a verified tree (row 0: the root, row ``i + 1``:
    node ``i``), computed on first access: ``rows[r]`` is the ``[V]`` float32 row after the
    generation's logits processors, :meth:`raw` the row before them, both on ``seq``'s device.

    Args:
        tree: the ``n``-node verified tree.
        seq: ``[L]`` the verified sequence (its last token is the root).
        processors: the generation's ``LogitsProcessorList`` (may be empty).
        hidden: ``[n + 1, H]`` the target's final hidden states, with ``head`` the function from
            hidden states to raw logits; or
        raw: ``[n + 1, V]`` logits computed already (then ``hidden`` and ``head`` are not used).
        block_rows: most rows per head call (``None``: the whole first-child chain at once).
        argmax_head: ``[k, H]`` hidden -> ``k`` argmax ids of the head's raw logits (exact; the backend's
            screen): with no processor, :meth:`argmax_block` uses it for rows not computed yet (a row read
            in full later is computed then).
    """

    def __init__(
        self,
        tree: TokenTree,
        seq: torch.Tensor,
        processors: LogitsProcessorList,
        hidden: torch.Tensor | None = None,
        head: HeadFn | None = None,
        raw: torch.Tensor | None = None,
        block_rows: int | None = 4,
        argmax_head: Callable[[torch.Tensor], list[int]] | None = None,
    ):
        if raw is None and (hidden is None or head is None):
            raise ValueError("TreeRows needs either raw logits or hidden states and a head")
        n = tree.num_nodes
        given = raw if raw is not None else hidden
        if given.ndim != 2 or given.shape[0] != n + 1:
            raise ValueError(f"expected {n + 1} rows (root first) for a {n}-node tree, got {tuple(given.shape)}")
        self.tree, self.seq, self.processors = tree, seq, processors
        self.hidden, self.head = hidden, head
        self.argmax_head = argmax_head if raw is None and len(processors) == 0 else None
        # row -> (the head call holding its raw logits, its index there): a row is viewed when read
        self._raw: dict[int, tuple[_HeadCall, int]] = {}
        self._processed: dict[int, torch.Tensor] = {}
        self.head_calls = 0  # output-head calls made by this object
        if block_rows is not None and int(block_rows) < 1:
            raise ValueError(f"block_rows must be >= 1 or None, got {block_rows}")
        self.block_rows = int(block_rows) if block_rows is not None else n + 1
        self._parent_row = [-1] + [p + 1 for p in tree.parent_list]  # row -> its parent's row (root: -1)
        first_child = [-1] * (n + 1)  # row -> row of its lowest-index child, or -1
        for row in range(n, 0, -1):
            first_child[self._parent_row[row]] = row
        self._first_child = first_child
        self._block: dict[int, list[int]] = {}  # row -> the rows computed in the same head call
        self._softmax: _Softmax | None = None
        self._stored: _HeadCall | None = None  # the last head call (block reads its rows together)
        self.known_argmax: dict[int, int] = {}  # processed argmax read already (a batched loop's one read)
        if raw is not None:
            every = list(range(n + 1))
            self._block = dict.fromkeys(every, every)
            self._stored = _HeadCall(every, raw, seq.device)
            self._raw = {r: (self._stored, r) for r in every}

    def __len__(self) -> int:
        return self.tree.num_nodes + 1

    @property
    def rows_computed(self) -> int:
        """Rows whose raw logits or argmax were computed (all ``n + 1`` when built from ``raw``)."""
        return len(self._raw.keys() | self.known_argmax.keys())

    def computed(self) -> list[int]:
        """The rows whose raw logits exist (reading them costs no head call)."""
        return list(self._raw)

    def raw(self, r: int) -> torch.Tensor:
        """``[V]`` the raw logits of row ``r``."""
        if r not in self._raw:
            self._compute_chain(r)
        call, i = self._raw[r]
        return call.kept()[i]

    def __getitem__(self, r: int) -> torch.Tensor:
        """``[V]`` the processed logits of row ``r``."""
        r = int(r)
        if r not in self._processed:
            self._processed[r] = self._process(r, self.raw(r))
        return self._processed[r]

    def argmax_block(self, r: int) -> dict[int, int]:
        """The processed argmax of row ``r`` and of the rows computed in the same head call, ``{row: token}``,
        in one device read (what greedy acceptance walks through next); without processors taken on the head's
        device (only the ids cross, see the module docstring)."""
        r = int(r)
        if r in self.known_argmax:
            return {row: t for row, t in self.known_argmax.items() if row in self._block.get(r, [r])}
        if self.argmax_head is not None and r not in self._raw:  # the argmax alone: the screen
            chain = self.plan(r)
            index = upload(torch.tensor(chain, device=HOST), self.hidden.device)
            self.store_argmax(chain, self.argmax_head(self.hidden.index_select(0, index)))
            return {row: self.known_argmax[row] for row in chain}
        if r not in self._raw:
            self._compute_chain(r)
        call = self._raw[r][0]
        if not len(self.processors):
            best = _argmax(call.logits).tolist()  # the head call's rows as they came
        else:
            best = torch.stack([self[row] for row in call.chain]).argmax(dim=-1).tolist()
        return dict(zip(call.chain, best))

    def block(self, rows: list[int]) -> torch.Tensor:
        """``[k, V]``: the processed rows ``rows``; without processors, the rows of the last head call as they came
        (no copy per row) where they hold them all."""
        if not len(self.processors) and self._stored is not None:
            chain, scores = self._stored.chain, self._stored.kept()
            if rows == chain:
                return scores
            where = {r: i for i, r in enumerate(chain)}
            if all(r in where for r in rows):
                index = upload(torch.tensor([where[r] for r in rows], device=HOST), scores.device)
                return scores.index_select(0, index)
        return torch.stack([self[r] for r in rows])

    def softmax(self) -> _Softmax:
        """A view whose ``[r]`` is the softmax of the processed row ``r`` (what sampling reads); one view per
        object, so a row's softmax is computed once (acceptance, then a drafter learning from the rows)."""
        if self._softmax is None:
            self._softmax = _Softmax(self)
        return self._softmax

    def _compute_chain(self, r: int) -> None:
        chain = self.plan(r)
        if chain == list(range(len(self))) and self.hidden.is_contiguous():  # every row, in order
            self.store(chain, self.head(self.hidden))
            return
        index = upload(torch.tensor(chain, device=HOST), self.hidden.device)
        self.store(chain, self.head(self.hidden.index_select(0, index)))  # [k, V]

    def plan(self, r: int = 0) -> list[int]:
        """The rows the next head call computes when row ``r`` is read (see the module docstring); a
        batched loop computes several trees' first blocks in one head call and hands them to :meth:`store`."""
        chain = [r] if r not in self._raw else []  # r (read in full, or screened), then
        r = self._first_child[r]  # its first child, ...
        while r != -1 and len(chain) < self.block_rows:
            if r not in self._raw and r not in self.known_argmax:
                chain.append(r)
            r = self._first_child[r]
        # room left in the block (a call over up to block_rows rows costs what one over 1 row does):
        # the rows a walk leaving the chain would read next, children of rows known or in this call
        known = set(chain) | set(self._raw) | set(self.known_argmax)
        for row in range(1, len(self)):
            if len(chain) == self.block_rows:
                break
            if row not in known and self._parent_row[row] in known:
                chain.append(row)
                known.add(row)
        return chain

    def store(self, chain: list[int], logits: torch.Tensor) -> None:
        """Raw logits ``[k, V]`` of the rows ``chain``, computed in one head call (left where the head returned
        them until a row is read in full: the module docstring)."""
        self.head_calls += 1
        self._stored = _HeadCall(chain, logits, self.seq.device)
        self._raw.update((r, (self._stored, i)) for i, r in enumerate(chain))
        self._block.update(dict.fromkeys(chain, chain))

    def store_argmax(self, chain: list[int], best: list[int], head_call: bool = True) -> None:
        """The processed argmax of the rows ``chain`` (host ints), from one screen call (``head_call``) or read from
        logits :meth:`store` holds already; rows not stored are computed only if read in full later."""
        self.head_calls += head_call
        for row, token in zip(chain, best):
            self.known_argmax[row], self._block[row] = int(token), chain

    def _process(self, r: int, raw: torch.Tensor) -> torch.Tensor:
        if len(self.processors) == 0:
            return raw
        path, row = [], r  # the node's ancestor path (host ids), root excluded
        while row > 0:
            path.append(self.tree.token_list[row - 1])
            row = self._parent_row[row]
        ids = self.seq
        if path:
            tail = upload(torch.tensor(path[::-1], dtype=self.seq.dtype, device=HOST), self.seq.device)
            ids = torch.cat([self.seq, tail])
        return self.processors(ids[None], raw[None].clone())[0]


class Verified(NamedTuple):
    """What one verification returns to acceptance and the update (:func:`verified`)."""

    rows: list[TreeRows]  #: each row's logits, computed where acceptance reads them
    hidden: torch.Tensor | None  #: ``[B, N, H]`` the final hidden states (``None``: the forward showed none)
    nodes: int  #: ``N - 1``: the widest row's nodes (every row's block is padded to it)


def verified(
    out,
    full: bool,
    head_rows: Callable,
    trees: list[TokenTree],
    seqs: list[torch.Tensor],
    processors: list[LogitsProcessorList],
    copy: bool = False,
    head: HeadFn | None = None,
    argmax_head=None,
    block_rows: int | None = None,
    heads=None,
    greedy: bool = True,
) -> Verified:
    """A verification forward's output ``out`` as :class:`Verified`, for ``B = len(trees)`` rows of ``N`` queries (the
    forward's first ``B`` rows and ``N`` queries; more are padding). ``full``: ``out`` is the model's (its logits, the
    hidden states from ``head_rows()``, the output head's input seen at that forward), else the decoder's (its final
    hidden states; each row's logits computed by ``head`` when read, ``argmax_head`` and ``block_rows`` as
    :class:`TreeRows`' and, with ``heads``, every row's first block in one call: :func:`first_blocks`). ``copy``: the
    forward's output is copied (a CUDA graph overwrites it at its next run)."""
    B, N = len(trees), max(tree.num_nodes for tree in trees) + 1
    if full:
        logits = out.logits[:B, :N]
        logits = logits.clone() if copy else logits
        hidden = head_rows()
        hidden = hidden.reshape(*out.logits.shape[:2], -1)[:B, :N] if hidden is not None else None
        rows = [
            TreeRows(tree, seq, p, raw=logits[b, : tree.num_nodes + 1])
            for b, (tree, seq, p) in enumerate(zip(trees, seqs, processors))
        ]
        return Verified(rows, hidden, N - 1)
    hidden = out.last_hidden_state[:B, :N]
    hidden = hidden.clone() if copy else hidden
    rows = [
        TreeRows(
            tree,
            seq,
            p,
            hidden=hidden[b, : tree.num_nodes + 1],
            head=head,
            block_rows=block_rows,
            argmax_head=argmax_head,
        )
        for b, (tree, seq, p) in enumerate(zip(trees, seqs, processors))
    ]
    if heads is not None:
        first_blocks(rows, hidden, heads, greedy)
    return Verified(rows, hidden, N - 1)


def first_blocks(rows: list[TreeRows], hidden: torch.Tensor, heads, greedy: bool = True) -> None:
    """The first block of every tree of a batch (row ``b``'s hidden states: ``hidden[b]``, ``[B, N, H]``) in one
    call: ``heads(m)`` gives ``(head, argmax_head)`` for a call of ``m`` rows (``argmax_head`` may be ``None``).
    With an ``argmax_head``, their argmaxes alone; else their logits, then (``greedy``) their argmaxes in one read:
    without processors on the head's device, else of the processed rows (read in full: one copy for the batch)."""
    B, N = hidden.shape[:2]
    plans = [r.plan(0) for r in rows]
    flat = torch.tensor([b * N + i for b, plan in enumerate(plans) for i in plan], device=hidden.device)
    first = hidden.reshape(B * N, -1).index_select(0, flat)
    head, argmax_head = heads(len(flat))
    if argmax_head is not None:
        best = argmax_head(first)
    else:
        logits = head(first)
        argmax_only = greedy and not any(len(r.processors) for r in rows)
        if not argmax_only:  # read in full: one copy for the batch
            logits = logits.to(device=rows[0].seq.device, dtype=torch.float32)
        start = 0
        for r, plan in zip(rows, plans):
            r.store(plan, logits[start : start + len(plan)])
            start += len(plan)
        if not greedy:
            return
        if argmax_only:
            best = _argmax(logits).tolist()
        else:
            best = torch.stack([r[i] for r, plan in zip(rows, plans) for i in plan]).argmax(dim=-1).tolist()
    start = 0
    for r, plan in zip(rows, plans):
        r.store_argmax(plan, best[start : start + len(plan)], head_call=argmax_head is not None)
        start += len(plan)


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """``[k]`` the argmax ids of raw rows ``[k, V]``, on their device: ``torch.argmax`` of the float32 values every
    row is read as (the same op on the same values as on the sequence's device, ties included)."""
    return logits.to(torch.float32).argmax(dim=-1)


class _HeadCall:
    """One head call's rows ``chain``: ``logits`` ``[k, V]`` as the head returned them (its device and dtype) until
    :meth:`kept` is asked for, the same rows as they are read (float32 on ``device``, the sequence's), copied once;
    then ``logits`` is that copy (the head's output is not held twice)."""

    def __init__(self, chain: list[int], logits: torch.Tensor, device: torch.device):
        self.chain, self.logits, self.device = chain, logits, device
        self._kept: torch.Tensor | None = None

    def kept(self) -> torch.Tensor:
        if self._kept is None:
            self._kept = self.logits = self.logits.to(device=self.device, dtype=torch.float32)
        return self._kept


class _Softmax:
    def __init__(self, rows: TreeRows):
        self.rows = rows
        self._cache: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, r: int) -> torch.Tensor:
        r = int(r)
        if r not in self._cache:
            self._cache[r] = self.rows[r].softmax(dim=-1)
        return self._cache[r]

    def stack(self, rows: list[int]) -> torch.Tensor:
        """``[k, V]``: the softmax of the processed rows ``rows``; those not read yet in one call."""
        missing = [r for r in rows if r not in self._cache]
        if missing:
            probs = self.rows.block(missing).softmax(dim=-1)
            if len(missing) == len(rows):
                self._cache.update(zip(missing, probs.unbind(0)))
                return probs
            self._cache.update(zip(missing, probs.unbind(0)))
        return torch.stack([self._cache[r] for r in rows])
