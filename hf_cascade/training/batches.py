"""Training batches from a :class:`~hf_cascade.training.store.DistillStore`: the held-out split, the padded
:class:`Batch`, and :class:`BatchStream`, the run's sequence of global batches.

A step takes one *global* batch of ``batch_size`` records from the stream. Processes (data parallel) and
gradient-accumulation micro-batches only divide it (:meth:`BatchStream.share`), so the records a step
trains on depend on ``batch_size`` and ``seed`` alone, not on how many processes compute it.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, fields

import numpy as np
import torch

from .store import DistillStore


@dataclass
class Batch:
    """Right-padded sequences. ``input_ids``: ``[B, T]``; ``weights``: ``[B, T]``, the loss weight of
    predicting ``input_ids[:, t]`` from the tokens before it (0 at padding and at t = 0);
    ``attention_mask``: ``[B, T]``; ``index``: the store records, for heads that read hidden states;
    ``response``: ``[B, T]`` bool, True where ``input_ids[:, t]`` is a token of the target's response."""

    input_ids: torch.Tensor
    weights: torch.Tensor
    attention_mask: torch.Tensor
    index: list[int]
    response: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> Batch:
        """The same batch with its tensors on ``device`` (itself when they are there already)."""
        device = torch.device(device)
        if self.input_ids.device == device:
            return self
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.to(device)
        return Batch(**moved)


def split_records(store: DistillStore, eval_records: int) -> tuple[list[int], list[int]]:
    """Deterministic train / held-out split by a hash of the record ids: the same set of records
    gives the same split whatever their order in the store (a resumed distillation splits like an
    uninterrupted one). Adding records may move earlier held-out records into training."""
    keyed = sorted(range(len(store)), key=lambda i: zlib.crc32(store.records[i].id.encode()))
    held = set(keyed[: min(eval_records, max(0, len(store) - 1))])
    return [i for i in range(len(store)) if i not in held], sorted(held)


def make_batch(store: DistillStore, index: list[int], max_len: int, prompt_weight: float, pad_id: int = 0) -> Batch:
    seqs = [store.sequence(i) for i in index]
    width = min(max_len, max(len(s) for s, _ in seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    weights = torch.zeros(len(seqs), width)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    response = torch.zeros(len(seqs), width, dtype=torch.bool)
    for b, (s, plen) in enumerate(seqs):
        n = min(width, len(s))
        ids[b, :n] = torch.from_numpy(s[:n].astype(np.int64))
        mask[b, :n] = 1
        weights[b, 1:n] = prompt_weight
        weights[b, max(1, plen) : n] = 1.0
        response[b, max(1, plen) : n] = True
    return Batch(ids, weights, mask, list(index), response)


class BatchStream:
    """Endless global batches of ``batch_size`` training records: a fresh permutation of ``train_idx``
    (``numpy`` generator seeded with ``seed``) each epoch, cut into batches, the remainder dropped.

    ``position`` counts the batches taken; a new stream :meth:`skip`-ped ``n`` batches continues exactly as
    one that yielded ``n`` (what a resumed run relies on)."""

    def __init__(
        self,
        store: DistillStore,
        train_idx: list[int],
        batch_size: int,
        max_len: int,
        prompt_weight: float,
        seed: int = 0,
    ):
        if batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {batch_size}")
        if len(train_idx) < batch_size:
            raise ValueError(
                f"{len(train_idx)} training sequences cannot fill a batch of {batch_size}: distill more "
                "prompts, lower --batch-size or --eval-records"
            )
        self.store, self.train_idx, self.batch_size = store, list(train_idx), batch_size
        self.max_len, self.prompt_weight = max_len, prompt_weight
        self._rng = np.random.default_rng(seed)
        self._order = np.zeros(0, dtype=np.int64)
        self._at = 0
        self.position = 0

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> list[int]:
        """The next global batch: its store record indices."""
        if self._at + self.batch_size > len(self._order):
            self._order, self._at = self._rng.permutation(self.train_idx), 0
        index = self._order[self._at : self._at + self.batch_size].tolist()
        self._at += self.batch_size
        self.position += 1
        return index

    def skip(self, n: int) -> None:
        """Advance by ``n`` batches without building them."""
        for _ in range(n):
            next(self)

    def batch(self, index: list[int]) -> Batch:
        return make_batch(self.store, index, self.max_len, self.prompt_weight)

    @staticmethod
    def share(index: list[int], rank: int, world: int, micro: int) -> list[list[int]]:
        """Process ``rank``'s part of a global batch (the ``rank``-th of ``world`` equal contiguous slices),
        cut into ``micro`` equal micro-batches. ``len(index)`` must be a multiple of ``world * micro``."""
        if len(index) % (world * micro):
            raise ValueError(
                f"a batch of {len(index)} sequences does not split into {world} process(es) x {micro} "
                "micro-batch(es) of equal size"
            )
        per = len(index) // world
        mine = index[rank * per : (rank + 1) * per]
        size = per // micro
        return [mine[m * size : (m + 1) * size] for m in range(micro)]


def iterate_batches(store: DistillStore, train_idx: list[int], cfg) -> BatchIterator:
    """Endless shuffled whole batches (epoch after epoch) of a :class:`~.loop.TrainConfig`'s size and seed."""
    return BatchIterator(BatchStream(store, train_idx, cfg.batch_size, cfg.max_len, cfg.prompt_weight, cfg.seed))


class BatchIterator:
    """:class:`Batch` after :class:`Batch` of a :class:`BatchStream` (``.stream``)."""

    def __init__(self, stream: BatchStream):
        self.stream = stream

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> Batch:
        return self.stream.batch(next(self.stream))


__all__ = ["Batch", "BatchIterator", "BatchStream", "iterate_batches", "make_batch", "split_records"]
