"""A drafter model's forwards compiled where verification is (:func:`~hf_cascade.core.compiled.call_compiles`).

A drafter that keeps its own KV cache across draft steps (:class:`~hf_cascade.drafters.neural.NeuralLevel`, GLIDE's
draft layer) runs, in a compiled call, :class:`StaticDraftForward`: its forward through ``torch.compile`` with the
call's :class:`~transformers.CompileConfig` (:func:`~hf_cascade.core.compiled.compiled_draft`, kept per model and
configuration across calls), over a bounded set of shapes, so that once they have been seen nothing recompiles:

* **the cache is static** (:class:`~hf_cascade.core.static.StaticSlots`: fixed buffers, every layer full) with the
  largest capacity built for this model in the process (:func:`~hf_cascade.core.static.kept_capacity`); its length
  is kept on the host, and a rollback lowers it (``crop``) without reading the device.
* **new tokens are padded to a query bucket** (:data:`~hf_cascade.core.static.QUERY_BUCKETS`), written after the
  real ones at the next positions (the padding repeats the last token): no real query sees them (the causal mask),
  and the cache's length is set back past the real ones only. More new tokens than the last bucket go in chunks of
  the last bucket.
* **the first forward of a call runs eagerly** over the same static cache, as the target's prefill does: its length
  is the prompt's, and its cache is not yet allocated, a shape no later forward has.
* **positions are tensors**, and the rows of logits kept are an index tensor (the last real query's) or all of them.
* **outputs are the caller's**: where the configuration may record CUDA graphs
  (:func:`~hf_cascade.core.compiled.records_graphs`), a graph's outputs are overwritten by its next replay, so every
  forward's logits are copied before the next one runs; a caller may keep them across forwards (GLIDE's root row).

The arithmetic is the eager forward's over the same keys (the mask hides the other columns), so a drafter proposes
the same tokens from the same distributions up to floating-point summation order; verification decides every
emitted token either way.
"""

from __future__ import annotations

import torch

from ..compat import cache_kwargs
from ..core.compiled import compiled_draft, records_graphs
from ..core.static import QUERY_BUCKETS, StaticSlots, bucket, kept_capacity


class StaticDraftForward:
    """One call's compiled forwards of a drafter ``model`` over a static cache (see the module docstring).

    ``fn(model, input_ids [1, Q], positions [Q], rows [r] | None, **kwargs)``: the drafter's forward as a function of
    the model (compiled once per model and configuration), returning logits of ``rows`` (``None``: every query);
    ``capacity``: the columns the call needs (its longest sequence)."""

    def __init__(self, model: torch.nn.Module, fn, compile_config, capacity: int):
        self.model, self.fn = model, fn
        self.slots = StaticSlots(model, None, kept_capacity(model, capacity + QUERY_BUCKETS[-1]))
        self.call = compiled_draft(model, fn, compile_config, _forward_key)
        self.kwargs = cache_kwargs(model, self.slots.cache)
        # CUDA graphs overwrite a graph's outputs at its next replay: the caller gets a copy (module docstring)
        self.copies = records_graphs(compile_config)
        self._rows: dict[tuple, torch.Tensor] = {}  # (row, device) -> the index tensor of the row kept (read only)

    @property
    def length(self) -> int:
        """Tokens whose K/V the cache holds (a host count)."""
        return self.slots.length

    def rollback(self, length: int) -> None:
        """Keep the first ``length`` tokens' K/V only."""
        self.slots.drop(self.slots.length - length)

    def _last_row(self, row: int, device: torch.device) -> torch.Tensor:
        """``[row]`` as the index tensor of the logits kept, made once per row and device."""
        key = (row, device)
        if key not in self._rows:
            self._rows[key] = torch.tensor([row], device=device)
        return self._rows[key]

    def __call__(self, ids: torch.Tensor, last: bool, **kwargs) -> torch.Tensor:
        """Logits ``[1, 1 | n, V]`` (``last``: the last token's row only) of the ``n`` tokens ``ids`` (``[n]`` on the
        model's device) written after the cached ones."""
        if self.slots.length == 0:  # the prompt: eager (see the module docstring)
            n = ids.shape[0]
            rows = torch.tensor([n - 1], device=ids.device) if last else None
            logits = self.fn(self.model, ids[None], torch.arange(n, device=ids.device), rows, **self.kwargs, **kwargs)
            self.slots.wrote(n)
            self.slots.keep(n, [])
            return logits
        out, end = [], ids.shape[0]
        for start in range(0, end, QUERY_BUCKETS[-1]):
            chunk = ids[start : start + QUERY_BUCKETS[-1]]
            n = chunk.shape[0]
            queries = bucket(n, self.slots.room())
            if queries > n:
                chunk = torch.cat([chunk, chunk[-1:].expand(queries - n)])
            positions = torch.arange(self.slots.length, self.slots.length + queries, device=ids.device)
            rows = self._last_row(n - 1, ids.device) if last else None
            logits = self.call(self.model, chunk[None], positions, rows, **self.kwargs, **kwargs)
            self.slots.wrote(queries)
            self.slots.keep(n, [])
            kept = logits if last else logits[:, :n]
            out.append(kept.clone() if self.copies else kept)
        return out[-1] if last or len(out) == 1 else torch.cat(out, dim=1)


def keep_draft_prefix(compiled: StaticDraftForward | None, cache, length: int) -> None:
    """Keep the first ``length`` tokens' K/V of a drafter's own cache: ``compiled``'s static slots in a compiled call
    (a host count lowered, no device read), else the dynamic ``cache`` (``Cache.crop`` with a negative count: the
    form transformers 4.57 and 5.x both take). Nothing to drop: nothing done."""
    if compiled is not None:
        if compiled.length > length:
            compiled.rollback(length)
        return
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def _forward_key(args, kwargs) -> tuple:
    """What makes one graph of a compiled draft forward: the padded input's shape, the rows kept, the cache and which
    keyword arguments are given."""
    rows, given = args[3], tuple(sorted(k for k, v in kwargs.items() if v is not None))
    return (
        tuple(args[1].shape),
        None if rows is None else tuple(rows.shape),
        id(kwargs.get("cache", kwargs.get("past_key_values"))),
        given,
    )


__all__ = ["StaticDraftForward", "keep_draft_prefix"]
