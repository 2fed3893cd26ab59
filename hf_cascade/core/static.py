"""Static caches: the verified prefix in fixed buffers, each draft written after it, rejected rows rolled back in place.

transformers' static layers (:class:`~transformers.cache_utils.StaticLayer`, transformers >= 5) hold ``[B, H, C, D]``
buffers and a running length on the device; a forward writes its K/V at that length, and ``crop(-n)`` lowers it
without moving anything. The core keeps the length on the host (:class:`StaticSlots`), so it never reads that counter.

* **verify** -- the root and the ``n`` nodes (compiled: and padding up to a query bucket, :data:`QUERY_BUCKETS`)
  are written at columns ``P .. P + Q - 1`` (``P``: the verified prefix); eager, nothing is padded (padding is
  work a forward does for nothing). A chain at consecutive positions uses the model's own
  causal mask (padding queries come after every real one: no real query sees them, and they are never accepted).
  Under an attention backend that applies no mask of the core's (flash attention), the layers show attention the
  prefix and the queries only, compiled too (:attr:`StaticSlots.sliced`): flash aligns its causal mask to the last key.
  A tree passes its mask over all ``C`` columns (:func:`~hf_cascade.core.attention.row_inputs`), each padding query
  attending to itself.
  A fixed set of query shapes is what lets a compiled verification run without recompiling (:mod:`.compiled`).
* **keep** -- a chain's accepted prefix is already in place; a tree's path is copied into the columns after the
  root (one ``index_copy_`` per layer on the device; the index is built on the host from acceptance's host path,
  so nothing is read back). Then the length goes back to prefix + root + path (``crop``).

Sliding-window layers (:class:`~transformers.cache_utils.StaticSlidingWindowLayer`) keep a rolling window and
cannot roll back once past it; a tree also needs, for its deeper nodes, keys the window of its root no longer
holds. The core's static cache therefore has full layers only: sliding layers are replaced by full layers of the
same capacity and the window is applied by the mask, as with dynamic caches (:mod:`.forward`). The arithmetic is
the same attention over the same keys; plain ``generate`` computes it over a rolling buffer instead.

A batch (:class:`StaticBatch`): ``B`` rows of the same buffers, each row keeping its own columns with holes, as a
dynamic batch cache does (:mod:`hf_cascade.core.batch_state`); the layers' shared counter is the host's
:attr:`StaticSlots.length`.

* **verify** -- the step's rectangular ``[B, N]`` block is written at the counter (columns ``T .. T + N - 1``).
  Eager, attention sees those ``T + N`` columns of the rows still running, nothing padded. Compiled (or a user's
  compiled forward), the block is padded to a query bucket and to the call's ``B`` rows (the rows that finished are
  padding: queries that attend to themselves only), and the mask spans the whole capacity: the shapes are those of
  the first steps, so nothing recompiles after warm-up.
* **keep** -- each row's kept columns are gathered to the block's front in place (the same buffers: a compiled graph
  or a CUDA graph holds them), then the counter goes back to ``T + M`` (``crop``: host arithmetic, no read).
* **drop** -- the batch dimension is fixed: the rows still running are moved, in place, to the first rows (a copy of
  their used columns when a row before them finished, as the dynamic cache's ``index_select`` copies every row);
  eager forwards then run those rows only, compiled ones keep ``B`` rows.
* **compact** -- as with a dynamic cache, each row's columns gathered right-aligned in place and the counter reset;
  also when the next block would not fit the capacity, after which drafts are cut to the room.
"""

from __future__ import annotations

import weakref

import torch
from transformers import Cache

from .. import placement
from .forward import verifies_trees

try:  # transformers >= 5: static layers roll back (crop)
    from transformers.cache_utils import StaticLayer
except ImportError:  # pragma: no cover - very old releases
    StaticLayer = None

#: query counts a verification is padded to (root + nodes + padding); past the last one, the count itself
QUERY_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def static_rollback_supported() -> bool:
    """Whether the installed transformers' static layers track their length on the device and roll back
    (``crop``), which the core's static path needs (transformers >= 5; 4.57's static layers do not)."""
    return StaticLayer is not None and bool(getattr(StaticLayer, "is_croppable", False))


def is_static(cache) -> bool:
    """Whether ``cache`` is a static cache (every layer a :class:`StaticLayer`)."""
    layers = getattr(cache, "layers", None)
    return bool(
        StaticLayer is not None
        and isinstance(cache, Cache)
        and layers
        and all(isinstance(layer, StaticLayer) for layer in layers)
    )


def is_filled(cache) -> bool:
    """Whether a static cache holds tokens. A layer initialised in advance (``StaticCache.early_initialization``, as
    export and CUDA-graph recipes do) but never written is not filled. One device read, once per call."""
    return any(getattr(layer, "is_initialized", False) for layer in cache.layers) and int(cache.get_seq_length()) > 0


_CAPACITY: weakref.WeakKeyDictionary[torch.nn.Module, int] = weakref.WeakKeyDictionary()


def kept_capacity(target: torch.nn.Module, capacity: int) -> int:
    """The capacity of the static cache the core builds for ``target``: the largest asked for in this process so far
    (as transformers keeps its largest static cache), so that calls of other lengths keep one cache shape and a
    compiled verification does not recompile for each of them."""
    kept = max(_CAPACITY.get(target, 0), capacity)
    _CAPACITY[target] = kept
    return kept


def call_capacity(target: torch.nn.Module, cfg, fixed_shapes: bool) -> int:
    """The columns of the static cache the core builds for a call: ``max_cache_len`` (else ``max_length``) and room for
    the last query bucket; with ``fixed_shapes`` (compiled), at least the largest built for ``target`` before
    (:func:`kept_capacity`)."""
    capacity = max(getattr(cfg, "max_cache_len", None) or 0, cfg.max_length) + QUERY_BUCKETS[-1]
    return kept_capacity(target, capacity) if fixed_shapes else capacity


def bucket(queries: int, room: int) -> int:
    """The padded query count for ``queries`` real queries with ``room`` free columns: the smallest bucket that
    holds them, else the count itself; never more than ``room``."""
    for size in QUERY_BUCKETS:
        if size >= queries:
            return min(size, max(room, queries))
    return queries


class _VisibleStaticLayer(StaticLayer if StaticLayer is not None else object):
    """A static layer that shows attention only its first ``visible`` columns (the verified prefix and the forward's
    own queries) when ``visible`` is set: verification then attends over what a dynamic cache would hold, not
    the whole buffer (eager, and under flash attention: :attr:`StaticSlots.sliced`); and, in a batch whose finished rows
    left (``rows`` set), its first ``rows`` rows only, which the forward's ``rows`` inputs write (in place, into a view
    of the buffers). Unset (``None``), it is transformers' static layer."""

    visible: int | None = None
    rows: int | None = None

    def update(self, key_states, value_states, *args, **kwargs):
        if self.rows is None or not self.is_initialized or self.rows == self.keys.shape[0]:
            keys, values = super().update(key_states, value_states, *args, **kwargs)
        else:  # StaticLayer.update on the first rows' view of the buffers
            columns = torch.arange(key_states.shape[-2], device=self.device) + self.cumulative_length
            self.cumulative_length.add_(key_states.shape[-2])
            keys, values = self.keys[: self.rows], self.values[: self.rows]
            keys.index_copy_(2, columns, key_states)
            values.index_copy_(2, columns, value_states)
        if self.visible is None:
            return keys, values
        return keys[:, :, : self.visible], values[:, :, : self.visible]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return (self.max_cache_len if self.visible is None else self.visible), 0


class StaticSlots:
    """The core's view of a static cache: its capacity, and the verified length kept on the host.

    ``given``: the user's :class:`~transformers.StaticCache` (unfilled) or ``None``; ``capacity``: the columns of a
    new cache. Either way every layer keeps every column (sliding-window layers become full ones).

    ``sliced``: attention sees only the verified prefix and the forward's queries (:class:`_VisibleStaticLayer`), not
    the whole capacity: eager (no padded work), and under every attention backend that does not apply the core's
    masks (:func:`~hf_cascade.core.forward.verifies_trees`: flash / paged / hub kernels), compiled too. Flash
    attention reads no 4-D mask and, given no 2-D one, applies causal attention bottom-right aligned over the keys it
    is handed (transformers' ``_flash_attention_forward``; flash-attn >= 2.1): over a whole capacity ``C`` a query
    ``i`` of ``q`` would see columns up to ``C - q + i``, unwritten and rejected ones included. Over ``P + q`` columns
    it sees exactly its prefix and the queries before it, as plain ``generate`` gives flash (a 2-D mask of ``P + q``
    columns, to which ``_upad_input`` slices the layer)."""

    def __init__(self, target, given: Cache | None, capacity: int, fixed_shapes: bool = True):
        if given is not None:
            if is_filled(given):
                raise ValueError(
                    "hf_cascade assistants start from the prompt: a filled StaticCache is not supported "
                    "(pass a new one)."
                )
            full = [layer.max_cache_len for layer in given.layers if not getattr(layer, "is_sliding", False)]
            capacity = max(full) if full else capacity  # a sliding layer's size is its window, not the cache's
            self.cache = given
        else:
            from transformers import StaticCache

            self.cache = StaticCache(config=target.config, max_cache_len=capacity)
        self.sliced = not fixed_shapes or not verifies_trees(target)
        layers = self.cache.layers
        for i, layer in enumerate(layers):  # unfilled: nothing is lost
            if self.sliced:  # attention over the visible columns only
                layers[i] = _VisibleStaticLayer(max_cache_len=capacity)
            elif getattr(layer, "is_sliding", False) or layer.max_cache_len != capacity or layer.is_initialized:
                layers[i] = StaticLayer(max_cache_len=capacity)  # an early-initialised layer: the call's own shapes
        self.fixed_shapes = fixed_shapes
        self.capacity = capacity
        self.length = 0  # columns holding verified tokens' K/V (the host's count)
        self.written = 0  # columns the last forward left the device counter at

    def columns(self, queries: int) -> int:
        """The columns the attention of a forward of ``queries`` columns after the verified prefix sees: the verified
        prefix and the queries where the layers are :attr:`sliced`, else the whole capacity."""
        return self.length + queries if self.sliced else self.capacity

    def show(self, end: int | None, rows: int | None = None) -> None:
        """Where the layers are :attr:`sliced`: the next forward's attention sees columns ``0 .. end - 1`` (``None``:
        every column, as a static cache handed back to the user) of the first ``rows`` rows (``None``: every row)."""
        if self.sliced:
            for layer in self.cache.layers:
                layer.visible, layer.rows = end, rows

    def room(self) -> int:
        """Free columns after the verified prefix."""
        return self.capacity - self.length

    def wrote(self, queries: int) -> None:
        """A forward wrote ``queries`` columns after the verified prefix."""
        self.written = self.length + queries

    def keep(self, kept: int, path: list[int]) -> None:
        """Keep ``kept`` columns of the last forward's (``path``: its accepted tree nodes, root excluded, copied into
        the columns after the root when they are not already there) and drop the rest."""
        root = self.length  # the root's column
        if path and path != list(range(len(path))):
            # the source and destination columns in one tensor, sent once per device (not once per layer)
            columns = torch.tensor(
                [[root + 1 + i for i in path], list(range(root + 1, root + 1 + len(path)))],
                dtype=torch.long,
                device=placement.HOST,
            )
            on: dict[torch.device, torch.Tensor] = {}
            for layer in self.cache.layers:
                if not getattr(layer, "is_initialized", False):
                    continue
                device = layer.keys.device
                if device not in on:
                    on[device] = placement.upload(columns, device)
                s, d = on[device]
                layer.keys.index_copy_(2, d, layer.keys.index_select(2, s))
                layer.values.index_copy_(2, d, layer.values.index_select(2, s))
        self.length += kept
        self.cache.crop(-(self.written - self.length)) if self.written > self.length else None
        self.written = self.length

    def drop(self, count: int) -> None:
        """Forget the last ``count`` verified columns (tokens past where generation stopped)."""
        if count > 0:
            self.cache.crop(-count)
            self.length -= count
            self.written = self.length

    def view(self) -> StaticView:
        """The verified prefix as a cache a drafter may read (:class:`StaticView`)."""
        return StaticView(self.cache, self.length)


class StaticView:
    """A static cache's verified prefix, read-only, in the shape of a ``DynamicCache``'s: ``layers[i].keys`` and
    ``.values`` are views of the first ``length`` columns; ``get_seq_length()`` is a host int (no device read).
    :attr:`full` is the static cache itself, for a compiled drafter that reads its fixed buffers with a mask (columns
    past ``length`` hold rejected drafts)."""

    class _Layer:
        def __init__(self, layer, length: int):
            self.keys = layer.keys[:, :, :length] if getattr(layer, "is_initialized", False) else None
            self.values = layer.values[:, :, :length] if getattr(layer, "is_initialized", False) else None

    def __init__(self, cache: Cache, length: int):
        self._cache, self._length = cache, length

    @property
    def full(self) -> Cache:
        return self._cache

    @property
    def layers(self) -> list:
        return [StaticView._Layer(layer, self._length) for layer in self._cache.layers]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._length


class StaticBatch:
    """The static cache of a batch of ``batch`` rows, in ``slots`` (:func:`~hf_cascade.core.compiled.open_slots`);
    ``length`` is the columns in use (``T``)."""

    def __init__(self, slots: StaticSlots, batch: int):
        self.slots, self.fixed_shapes = slots, slots.fixed_shapes
        self.cache, self.capacity, self.batch = slots.cache, slots.capacity, batch
        self.live = batch  # rows still running: the buffers' first rows
        self.width = 0  # the columns the next forward's attention sees

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
        (:meth:`~hf_cascade.core.static.StaticSlots.columns`: the capacity, or where the layers are sliced the columns
        in use and the queries), returned as the mask's width."""
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
            live[:, :, start : start + width].copy_(live.gather(2, idx))

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


__all__ = [
    "QUERY_BUCKETS",
    "StaticBatch",
    "StaticSlots",
    "StaticView",
    "bucket",
    "call_capacity",
    "is_static",
    "kept_capacity",
    "static_rollback_supported",
]
