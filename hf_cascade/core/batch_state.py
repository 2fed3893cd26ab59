"""The state of one batched ``generate()`` call (:mod:`hf_cascade.core.batch`): its rows, the shared cache and
the columns each row owns in it (holes, dropping finished rows, compaction), the output. A static cache keeps the
same columns in fixed buffers (:class:`~hf_cascade.core.static.StaticBatch`).

Kept apart from the loop's steps so that each reads on its own; nothing here decides what to draft."""

from __future__ import annotations

import torch
from transformers import DynamicCache, LogitsProcessorList
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..processors import row_processors
from .attention import additive, batch_tree_allowed, per_layer_type
from .compiled import open_slots, verify_call
from .forward import mask_device_dtype, verifies_trees
from .head_input import HeadInput, input_device
from .outputs import batch_outputs
from .payoff.gate import DraftGate
from .phases import Row
from .static import StaticBatch
from .stats import PhaseTimer
from .stopping import Stopper
from .strategy import TreeStep

#: compact the cache when columns a row does not own (padding, holes) exceed this share of it
COMPACT_SHARE = 1 / 3


class BatchRun:
    """One batched ``generate()`` call: the target, its settings, the shared cache and the active rows."""

    def __init__(
        self,
        target,
        drafters,
        input_ids,
        attention_mask,
        logits_processor,
        stopping_criteria,
        cfg,
        stats,
        block_rows,
        given=None,
    ):
        self.target, self.cfg, self.stats, self.block_rows = target, cfg, stats, block_rows
        self.processors = logits_processor or LogitsProcessorList()
        self.timer = PhaseTimer(stats, target)
        self.scores = () if cfg.return_dict_in_generate and cfg.output_scores else None  # None: not asked for
        self.raw_logits = () if cfg.return_dict_in_generate and cfg.output_logits else None
        self.head_input = HeadInput(target)
        self.head = None
        self.screen = None  # rows per head call -> (head, argmax head) (head_input.screen_heads)
        self.plain_screen = None  # the same where no drafter reads the rows (plain steps)
        self.verify_seconds: float | None = None
        self.verify_nodes: int | None = None
        self.device = input_device(target, input_ids)
        ids = input_ids.to(self.device)
        host = input_ids.tolist()
        mask = attention_mask.tolist() if attention_mask is not None else [[1] * len(r) for r in host]
        pad = cfg.pad_token_id if cfg.pad_token_id is not None else getattr(cfg, "_pad_token_tensor", None)
        self.pad_id = int(torch.as_tensor(pad).flatten()[0]) if pad is not None else None
        self.width = ids.shape[1]
        self.rows = []
        for b, (tokens, m) in enumerate(zip(host, mask)):
            p = m.index(1)
            self.rows.append(
                Row(
                    b,
                    p,
                    ids[b],
                    tokens[p:],
                    drafters[b],
                    Stopper(cfg, stopping_criteria),
                    stats.rows[b],
                    row_processors(self.processors, b),
                )
            )
        if self.pad_id is None:
            self.pad_id = 0  # fills padded queries only; checked again in result()
            self._need_pad = True
        else:
            self._need_pad = False
        self.finished: list[Row] = []
        self.gate = DraftGate()
        slots = open_slots(target, cfg, given)  # a static cache's bookkeeping (core/static.py)
        self.static = StaticBatch(slots, len(self.rows)) if slots is not None else None
        self.cache = self.static.cache if self.static is not None else DynamicCache()
        # what verifies: the decoder (eager or compiled), or the user's compiled forward (full logits, never bypassed)
        self.call, self.full_forward = verify_call(target, self.cache, cfg)
        self.past_pos = torch.empty(len(self.rows), 0, dtype=torch.long, device=self.device)
        self._dtype = mask_device_dtype(target)[1]
        #: the attention backend applies no 4-D mask (flash attention): chains only, with a 2-D ownership mask
        self.flash = not verifies_trees(target)

    def mask(self, past_pos, query, ancestors, width: int | None = None):
        """The ``attention_mask`` argument (per layer type when the model mixes full and sliding layers), ``width``
        columns wide where attention sees more than the cache's columns and the queries (a static cache's).
        Under flash attention (:attr:`flash`): the 2-D ownership mask (:func:`ownership_mask`)."""
        if self.flash:
            return ownership_mask(past_pos, query, width)

        def build(window):
            allowed = batch_tree_allowed(past_pos, query, ancestors, window)
            if width is not None and width > allowed.shape[-1]:
                allowed = torch.cat([allowed, allowed.new_zeros(*allowed.shape[:2], width - allowed.shape[-1])], -1)
            return additive(allowed, self._dtype)

        return per_layer_type(self.target, build)

    def state(self, b: int, cache: bool = True) -> TreeStep:
        """Row ``b``'s :class:`TreeStep`; its ``cache`` (a copy of the row's K/V) only for a drafter that reads
        the target's cache, and only where it may draft (``cache``: ``on_accept`` reads none)."""
        row = self.rows[b]
        cache = self.row_cache(b) if cache and getattr(row.drafter, "reads_target_cache", False) else None
        return row.step_state(cache, self.verify_seconds, self.verify_nodes)

    def row_cache(self, b: int) -> DynamicCache:
        """Row ``b``'s K/V alone, as a batch-1 ``DynamicCache`` (a copy of the columns it owns)."""
        cache, cols = DynamicCache(), self.rows[b].cols
        for i, layer in enumerate(self.cache.layers):
            if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                continue
            idx = torch.tensor(cols, dtype=torch.long, device=layer.keys.device)
            cache.update(layer.keys[b : b + 1].index_select(2, idx), layer.values[b : b + 1].index_select(2, idx), i)
        return cache

    # -- the cache's columns ------------------------------------------------------------------------
    def _gather(self, index: list[list[int]], start: int) -> None:
        """Every layer keeps ``[:start]`` and then, per row, the columns ``start + index[b]``: the step's block is
        gathered, written back in place and the rest cut off (a view), so ``[:start]`` is not copied here."""
        if self.static is not None:
            return self.static.gather(index, start)
        width = len(index[0])
        host = torch.tensor(index, dtype=torch.long) + start
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                continue
            B, H, _, D = layer.keys.shape
            idx = host.to(layer.keys.device)[:, None, :, None].expand(B, H, width, D)
            for name in ("keys", "values"):
                kv = getattr(layer, name)
                kv[:, :, start : start + width].copy_(kv.gather(2, idx))
                setattr(layer, name, kv[:, :, : start + width])

    def keep(self, kept: list[list[int]]) -> None:
        """After a verification: row ``b`` keeps the step's block columns ``kept[b]`` (root first), in order."""
        T, M = self.past_pos.shape[1], max(len(k) for k in kept)
        moved = any(k != list(range(len(k))) for k in kept)
        if moved or (self.static is None and self.cache.get_seq_length() != T + M):
            self._gather([k + [k[-1]] * (M - len(k)) for k in kept], T)
        if self.static is not None:
            self.static.cut(T + M)  # the counter back to the columns kept (no read)
        positions = []
        for row, k in zip(self.rows, kept):
            first = row.length - len(k) - 1  # the root's position (tokens were appended already)
            positions.append([first + j for j in range(len(k))] + [-1] * (M - len(k)))
            row.cols += [T + j for j in range(len(k))]
        self.past_pos = torch.cat([self.past_pos, torch.tensor(positions, dtype=torch.long, device=self.device)], dim=1)

    def drop(self, done: list[int]) -> None:
        """Rows that finished leave the batch (and its cache)."""
        if not done:
            return
        stay = [b for b in range(len(self.rows)) if b not in set(done)]
        self.finished += [self.rows[b] for b in done]
        self.rows = [self.rows[b] for b in stay]
        if not stay:
            return
        index = torch.tensor(stay, dtype=torch.long)
        if self.static is not None:
            self.static.keep_rows(stay)  # a static batch keeps its rows: the running ones first
        else:
            for layer in self.cache.layers:
                if getattr(layer, "keys", None) is not None and layer.keys.numel():
                    i = index.to(layer.keys.device)
                    layer.keys, layer.values = layer.keys.index_select(0, i), layer.values.index_select(0, i)
        self.past_pos = self.past_pos.index_select(0, index.to(self.device))

    def compact_if_sparse(self, force: bool = False) -> None:
        """Gather every row's columns right-aligned when padding and holes exceed :data:`COMPACT_SHARE` (``force``:
        whenever some column is free, as when a static cache's next block would not fit)."""
        if not self.rows:
            return
        T = self.past_pos.shape[1]
        owned = [len(row.cols) for row in self.rows]
        sparse = T * len(self.rows) - sum(owned) > COMPACT_SHARE * T * len(self.rows) and T - max(owned) >= 8
        if T == 0 or not (sparse or (force and T > max(owned))):
            return
        width = max(owned)
        index = [[row.cols[0] if row.cols else 0] * (width - len(row.cols)) + row.cols for row in self.rows]
        self._gather(index, 0)
        if self.static is not None:
            self.static.cut(width)
        self.past_pos = torch.tensor(
            [[-1] * (width - n) + list(range(n)) for n in owned], dtype=torch.long, device=self.device
        )
        for row, n in zip(self.rows, owned):
            row.cols = list(range(width - n, width))
        self.stats.compactions += 1

    def result(self):
        if self.static is not None:
            self.static.release()
        rows = sorted(self.finished + self.rows, key=lambda r: r.index)
        longest = max(row.width for row in rows)
        if self._need_pad and any(row.width < longest for row in rows):
            raise ValueError(
                "rows of a batch stopped at different lengths and the generation config has no "
                "pad_token_id to fill them with (set generation_config.pad_token_id)."
            )
        filled = [torch.cat([row.full, row.full.new_full((longest - row.width,), self.pad_id)]) for row in rows]
        sequences = torch.stack(filled)
        if self.cfg.return_dict_in_generate:
            scores, logits = batch_outputs(
                self.target, rows, sequences, self.width, self.scores is not None, self.raw_logits is not None
            )
            return GenerateDecoderOnlyOutput(sequences=sequences, scores=scores, logits=logits)
        return sequences


def ownership_mask(past_pos: torch.Tensor, query: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """``[B, T + N]`` (``width`` columns where wider, zeros after): 1 where row ``b`` owns the column (a cached
    column at a position ``>= 0``, or a real query), 0 for left padding, holes and padding queries. Flash attention's
    padded mode (transformers' ``_upad_input``) keeps each row's marked keys in order and aligns causal attention
    bottom-right over them, its queries being the last ``N`` columns: exact for a batch of **chains**, because

    * a row's kept keys are its positions ``0 .. L - 1`` in column order (holes and padding hold none; a row's
      columns only grow to the right, and compaction keeps their order), so key rank is position: the causal
      diagonal and a sliding window (counted in kept keys) are those of the row's own sequence;
    * its real queries (the root, then the chain) are its last kept columns, consecutive positions after its
      cache; its padding queries come after them and are not kept (flash returns zeros there, never read);
    * RoPE positions come from ``position_ids``, not from the column index, so a hole shifts nothing.

    A tree's siblings would see each other under bottom-right causal attention: trees are refused under flash.
    A row with no column at all (a compiled static batch's finished rows) keeps its first query, so that no
    sequence of the packed batch is empty."""
    owned = torch.cat([past_pos >= 0, query >= 0], dim=-1)
    owned[:, past_pos.shape[1]] |= ~owned.any(-1)  # on the device: nothing read
    if width is not None and width > owned.shape[-1]:
        owned = torch.cat([owned, owned.new_zeros(owned.shape[0], width - owned.shape[-1])], -1)
    return owned.long()


__all__ = ["COMPACT_SHARE", "BatchRun", "ownership_mask"]
