"""A batch's static cache (:mod:`hf_cascade.core.batch`): ``B`` rows of fixed buffers, holes kept in place.

The batched loop keeps, per row, the columns it owns in a cache with one length for every row
(:mod:`hf_cascade.core.batch_state`). With a static cache (``cache_implementation="static"`` or a user's
``StaticCache``) that length is the layers' shared counter, kept on the host by
:class:`~hf_cascade.core.static.StaticSlots` (its buffers, capacity and rollback are batch 1's):

* **verify** -- the step's rectangular ``[B, N]`` block is written at the counter (columns ``T .. T + N - 1``).
  Eager, attention sees those ``T + N`` columns of the rows still running, nothing padded. Compiled (or a user's
  compiled forward), the block is padded to a query bucket (:data:`~hf_cascade.core.static.QUERY_BUCKETS`) and to
  the call's ``B`` rows (the rows that finished are padding: queries that attend to themselves only), and the mask
  spans the whole capacity: the shapes are those of the first steps, so nothing recompiles after warm-up.
* **keep** -- each row's kept columns are gathered to the block's front in place (the same buffers: a compiled graph
  or a CUDA graph holds them), then the counter goes back to ``T + M`` (``crop``: host arithmetic, no read).
* **drop** -- the batch dimension is fixed: the rows still running are moved, in place, to the first rows (a copy of
  their used columns when a row before them finished, as the dynamic cache's ``index_select`` copies every row);
  eager forwards then run those rows only, compiled ones keep ``B`` rows.
* **compact** -- as with a dynamic cache, each row's columns gathered right-aligned in place and the counter reset;
  also when the next block would not fit the capacity (:func:`fit_room`), after which drafts are cut to the room.
"""

from __future__ import annotations

import torch

from ..compat import CACHE
from .compiled import call_compiles, user_compiled
from .static import StaticSlots, bucket, call_capacity, is_static


def open_slots(target, cfg, given) -> StaticSlots | None:
    """The static cache the core verifies in, for one row or a batch, where the call asks for one
    (``cache_implementation="static"``: ``generate`` built a cache sized for plain decoding, not filled yet, and
    the core builds its own; or ``given``, the user's ``StaticCache``); ``None`` for a dynamic cache. Its capacity has
    room for the last bucket of drafts (:func:`~hf_cascade.core.static.call_capacity`). Compiled (or a user's
    compiled forward), shapes are fixed: the largest capacity per target, queries padded to buckets; eager, neither
    (padding and unused columns are work a forward does for nothing)."""
    mine = getattr(cfg, "cache_implementation", None) == "static"
    if not (mine or is_static(given)):
        return None
    fixed = user_compiled(target) or call_compiles(target, {CACHE: given}, cfg)
    return StaticSlots(target, None if mine else given, call_capacity(target, cfg, fixed), fixed)


class StaticBatch:
    """The static cache of a batch of ``batch`` rows, in ``slots`` (:func:`open_slots`); ``length`` is the columns in
    use (``T``)."""

    def __init__(self, slots: StaticSlots, batch: int):
        self.slots, self.fixed_shapes = slots, slots.fixed_shapes
        self.cache, self.capacity, self.batch = slots.cache, slots.capacity, batch
        self.live = batch                          # rows still running: the buffers' first rows
        self.width = 0                             # the columns the next forward's attention sees

    @property
    def length(self) -> int:
        return self.slots.length

    def room(self) -> int:
        return self.slots.room()

    def shape(self, rows: int, queries: int) -> tuple[int, int]:
        """``(rows, queries)`` of the forward verifying ``rows`` running rows' ``queries``: compiled, the call's
        ``B`` rows and a query bucket; eager, as given."""
        if self.fixed_shapes:
            return self.batch, bucket(queries, self.room())
        return rows, queries

    def show(self, rows: int, queries: int) -> int:
        """Before a forward of ``queries`` columns over the first ``rows`` rows: the columns its attention sees
        (:meth:`~hf_cascade.core.static.StaticSlots.columns`: the capacity, or where the layers are sliced the columns in
        use and the queries), returned as the mask's width."""
        self.width = self.slots.columns(queries)
        self.slots.show(self.width, rows if rows < self.batch else None)
        return self.width

    def wrote(self, queries: int) -> None:
        """A forward wrote ``queries`` columns at the counter."""
        self.slots.wrote(queries)

    def prefilled(self, columns: int) -> None:
        self.slots.length = self.slots.written = columns

    def cut(self, length: int) -> None:
        """``length`` columns in use from now on: the counter goes back to it (from what the last forward, or the
        columns in use, left it at)."""
        top = max(self.slots.written, self.slots.length)
        if top > length:
            self.cache.crop(-(top - length))
        self.slots.length = self.slots.written = length

    def _buffers(self):
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False):
                yield layer.keys
                yield layer.values

    def gather(self, index: list[list[int]], start: int) -> None:
        """Running row ``b`` keeps, at columns ``start ..``, its columns ``start + index[b]``: gathered, then written
        back into the same buffers."""
        rows, width = len(index), len(index[0])
        host = torch.tensor(index, dtype=torch.long) + start
        for kv in self._buffers():
            live = kv[:rows]
            idx = host.to(kv.device)[:, None, :, None].expand(rows, kv.shape[1], width, kv.shape[3])
            live[:, :, start:start + width].copy_(live.gather(2, idx))

    def keep_rows(self, stay: list[int]) -> None:
        """Only the running rows ``stay`` (indices among the running rows) go on: moved to the first rows."""
        n, T = len(stay), self.length
        if stay != list(range(n)) and T:
            index = torch.tensor(stay, dtype=torch.long)
            for kv in self._buffers():
                kv[:n, :, :T].copy_(kv[:, :, :T].index_select(0, index.to(kv.device)))
        self.live = n

    def release(self) -> None:
        """Handed back (a user's cache): a plain static cache again."""
        self.slots.show(None)


def fit_room(run, drafts: list[tuple]) -> list[tuple]:
    """The step's drafts where the next block fits the static cache: compacted first where it would not (forced:
    :meth:`~hf_cascade.core.batch_state.BatchRun.compact_if_sparse`), then every draft cut to the room left."""
    static, need = run.static, max(tree.num_nodes for tree, _ in drafts) + 1
    if static.length + need > static.capacity:
        run.compact_if_sparse(force=True)
    room = static.room()
    if room < 1:
        raise ValueError(f"the static cache's {static.capacity} columns cannot hold the batch's next step "
                         f"({static.length} in use); give it max_cache_len >= max_length.")
    if need <= room:
        return drafts
    return [run.gate.cut(tree, q, room - 1) for tree, q in drafts]


__all__ = ["StaticBatch", "fit_room"]
