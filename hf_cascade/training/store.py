"""The on-disk format of distillation data: append-only, memory-mapped, resumable.

A distillation directory holds::

    meta.json       what produced it (target, prompt template, max_new_tokens, hidden size)
    tokens.bin      int32, all sequences back to back (prompt ids, then the target's response)
    hidden.bin      float16 [n_tokens, hidden_size], the target's last hidden state at every
                    position (only with ``hidden_states=True``; ReDrafter-style heads read it)
    records.jsonl   one line per finished prompt: id, source, offset, prompt_len, length, eos

Writes are ordered so that an interrupt at any moment leaves a readable store: a record line is
written only after its tokens (and hidden states) are flushed, and :meth:`DistillStore.open`
truncates the binary files to the end of the last complete record. Resuming skips finished ids.

A *sharded* store is a directory of such stores (no ``meta.json`` of its own): every sub-directory (or symbolic
link to one) holding a ``meta.json`` is a shard, read in name order. :class:`ShardWriter` writes one
(``shard-00000``, ``shard-00001``, ... of at most about ``shard_tokens`` tokens each; ``hf-cascade distill
--teacher-forced``), and a link to another store mixes its records in (``ln -s ../greedy DIR/greedy``).
:meth:`DistillStore.open` opens either kind, so training reads a sharded store as it reads one store: the records
of all shards with their offsets in one token sequence, tokens and hidden states read from each shard's
memory-mapped files (:class:`ShardedStore`), never loaded whole.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

FORMAT_VERSION = 1


@dataclass(frozen=True)
class Record:
    """One distilled sequence: ``tokens[offset : offset + length]``, the first ``prompt_len`` of
    them the (tokenized, templated) prompt, the rest the target's greedy response."""

    id: str
    source: str
    offset: int
    prompt_len: int
    length: int
    eos: bool


class DistillStore:
    """Append-only writer/reader of one distillation directory (see the module docstring)."""

    def __init__(self, path: str | Path, meta: dict, records: list[Record]):
        self.path = Path(path)
        self.meta = meta
        self.records = records
        self.hidden_size = int(meta.get("hidden_size") or 0)

    # -- opening -----------------------------------------------------------------------------
    @classmethod
    def create_or_resume(cls, path: str | Path, meta: dict) -> DistillStore:
        """Open ``path`` for appending; a new store gets ``meta``. An existing store must have been
        made with the same settings (``ValueError`` otherwise) and is truncated to its last record."""
        path = Path(path)
        if (path / "meta.json").is_file():
            store = cls.open(path, repair=True)
            keys = ("target", "prompt_format", "max_new_tokens", "hidden_size", "teacher_forced", "max_len")
            diff = {k: (store.meta.get(k), meta.get(k)) for k in keys if store.meta.get(k) != meta.get(k)}
            if diff:
                raise ValueError(f"{path} was distilled with other settings {diff}; use a new --out directory")
            return store
        path.mkdir(parents=True, exist_ok=True)
        meta = {"format_version": FORMAT_VERSION, **meta}
        (path / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        for name in ("tokens.bin", "records.jsonl") + (("hidden.bin",) if meta.get("hidden_size") else ()):
            (path / name).touch()
        return cls(path, meta, [])

    @classmethod
    def open(cls, path: str | Path, repair: bool = False) -> DistillStore | ShardedStore:
        """Open an existing store, or a sharded one (:class:`ShardedStore`), for reading (``repair``: truncate torn
        writes of an interrupt)."""
        path = Path(path)
        if not (path / "meta.json").is_file() and shard_dirs(path):
            return ShardedStore(path, [cls.open(d, repair) for d in shard_dirs(path)])
        if not (path / "meta.json").is_file():
            raise FileNotFoundError(
                f"{path} is not a distillation directory (no meta.json); run `hf-cascade distill` first"
            )
        meta = json.loads((path / "meta.json").read_text())
        if meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{path}: unsupported distillation format {meta.get('format_version')}")
        records = []
        with open(path / "records.jsonl", encoding="utf-8") as f:
            for line in f:
                try:
                    records.append(Record(**json.loads(line)))
                except (json.JSONDecodeError, TypeError):
                    break  # a torn last line
        store = cls(path, meta, records)
        if repair:
            store._truncate()
        return store

    def _truncate(self) -> None:
        end = self.num_tokens
        with open(self.path / "records.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(asdict(r)) + "\n" for r in self.records)
        os.truncate(self.path / "tokens.bin", end * 4)
        if self.hidden_size:
            os.truncate(self.path / "hidden.bin", end * self.hidden_size * 2)

    # -- writing -----------------------------------------------------------------------------
    def append(
        self, id: str, source: str, prompt_ids, response_ids, eos: bool, hidden: np.ndarray | None = None
    ) -> Record:
        """Append one sequence (``hidden``: ``[prompt_len + response_len, hidden_size]``)."""
        ids = np.concatenate([np.asarray(prompt_ids, dtype=np.int32), np.asarray(response_ids, dtype=np.int32)])
        if self.hidden_size:
            if hidden is None or hidden.shape != (ids.shape[0], self.hidden_size):
                raise ValueError(f"hidden states of shape {(ids.shape[0], self.hidden_size)} expected")
            _append_bytes(self.path / "hidden.bin", hidden.astype(np.float16))
        _append_bytes(self.path / "tokens.bin", ids)
        rec = Record(id, source, self.num_tokens, len(prompt_ids), int(ids.shape[0]), bool(eos))
        with open(self.path / "records.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(asdict(rec)) + "\n")
        self.records.append(rec)
        return rec

    def absorb(self, part: DistillStore) -> int:
        """Append the records of ``part`` (a store with the same settings) that this store lacks, in
        ``part``'s order; returns how many. Merging a part again after an interrupted merge adds the rest."""
        have = self.done_ids()
        added = 0
        for i, r in enumerate(part.records):
            if r.id in have:
                continue
            seq, plen = part.sequence(i)
            hidden = np.asarray(part.hidden()[r.offset : r.offset + r.length]) if self.hidden_size else None
            self.append(r.id, r.source, seq[:plen], seq[plen:], r.eos, hidden)
            added += 1
        return added

    # -- reading -----------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return self.records[-1].offset + self.records[-1].length if self.records else 0

    def done_ids(self) -> set[str]:
        return {r.id for r in self.records}

    def tokens(self) -> np.ndarray:
        """All tokens, memory-mapped (``[num_tokens]`` int32)."""
        if self.num_tokens == 0:
            return np.zeros(0, dtype=np.int32)
        return np.memmap(self.path / "tokens.bin", dtype=np.int32, mode="r", shape=(self.num_tokens,))

    def hidden(self) -> np.ndarray:
        """All hidden states, memory-mapped (``[num_tokens, hidden_size]`` float16)."""
        if not self.hidden_size:
            raise ValueError(f"{self.path} has no hidden states (distill with --hidden-states)")
        return np.memmap(
            self.path / "hidden.bin", dtype=np.float16, mode="r", shape=(self.num_tokens, self.hidden_size)
        )

    def sequence(self, i: int) -> tuple[np.ndarray, int]:
        """``(ids [length], prompt_len)`` of record ``i``."""
        r = self.records[i]
        return np.asarray(self.tokens()[r.offset : r.offset + r.length]), r.prompt_len

    def __len__(self) -> int:
        return len(self.records)


def _append_bytes(path: Path, array: np.ndarray) -> None:
    with open(path, "ab") as f:
        f.write(np.ascontiguousarray(array).tobytes())
        f.flush()
        os.fsync(f.fileno())


def shard_dirs(path: str | Path) -> list[Path]:
    """The shards of a sharded store ``path``: its sub-directories (links followed) holding a ``meta.json``, by name."""
    path = Path(path)
    if not path.is_dir():
        return []
    return sorted((d for d in path.iterdir() if (d / "meta.json").is_file()), key=lambda d: d.name)


class _Rows:
    """The rows of several memory-mapped ``[n_i, ...]`` arrays as one ``[sum n_i, ...]`` array, read lazily: a slice
    reads only the shards it covers (what :meth:`ShardedStore.hidden` returns)."""

    def __init__(self, parts):
        self._parts = list(parts)
        self._starts = np.cumsum([0] + [len(p) for p in self._parts])
        first = self._parts[0]
        self.shape = (int(self._starts[-1]),) + tuple(first.shape[1:])
        self.dtype = first.dtype

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key):
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("the rows of a sharded store are read by contiguous slices")
        start, stop, _ = key.indices(self.shape[0])
        pieces = []
        j = int(np.searchsorted(self._starts, start, side="right")) - 1
        while start < stop:
            base, end = int(self._starts[j]), int(self._starts[j + 1])
            take = min(stop, end)
            pieces.append(np.asarray(self._parts[j][start - base : take - base]))
            start, j = take, j + 1
        if len(pieces) == 1:
            return pieces[0]
        return np.concatenate(pieces) if pieces else np.zeros((0,) + self.shape[1:], dtype=self.dtype)

    def __array__(self, dtype=None, copy=None):
        whole = self[:]
        return whole if dtype is None else whole.astype(dtype)


class ShardedStore:
    """Read-only view of a sharded store (see the module docstring): the interface training reads of a
    :class:`DistillStore` (``records`` with offsets into all shards' tokens, ``tokens()``, ``hidden()``,
    ``sequence(i)``, ``meta``, ``hidden_size``, ``num_tokens``). Its shards must come from one target (``target`` and
    ``vocab_size`` alike); it has hidden states when every shard has them, of one size. ``meta`` keeps the values
    the shards share and lists the ones that differ (e.g. a greedy and a teacher-forced shard's ``prompt_format``)."""

    def __init__(self, path: str | Path, shards: list[DistillStore]):
        self.path, self.shards = Path(path), shards
        for key in ("target", "vocab_size"):
            values = {json.dumps(s.meta.get(key)) for s in shards}
            if len(values) > 1:
                raise ValueError(f"the shards of {path} come from different targets ({key}: {sorted(values)})")
        sizes = {s.hidden_size for s in shards}
        if len(sizes - {0}) > 1:
            raise ValueError(f"the shards of {path} hold hidden states of different sizes {sorted(sizes)}")
        self.hidden_size = 0 if 0 in sizes else sizes.pop()
        self.meta = {}
        for key in dict.fromkeys(k for s in shards for k in s.meta):
            values = list(dict.fromkeys(json.dumps(s.meta.get(key)) for s in shards))
            self.meta[key] = json.loads(values[0]) if len(values) == 1 else [json.loads(v) for v in values]
        self.meta["hidden_size"] = self.hidden_size
        self.records, self._where = [], []
        base = 0
        for j, s in enumerate(shards):
            for i, r in enumerate(s.records):
                self.records.append(Record(r.id, r.source, base + r.offset, r.prompt_len, r.length, r.eos))
                self._where.append((j, i))
            base += s.num_tokens

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.shards)

    def done_ids(self) -> set[str]:
        return {r.id for r in self.records}

    def tokens(self) -> np.ndarray:
        """All tokens (``[num_tokens]`` int32, in memory: 4 bytes a token)."""
        return np.concatenate([np.asarray(s.tokens()) for s in self.shards]) if self.shards else np.zeros(0, np.int32)

    def hidden(self) -> _Rows:
        """All hidden states (``[num_tokens, hidden_size]`` float16), read from the shards' memory maps by slice."""
        if not self.hidden_size:
            raise ValueError(f"{self.path}: not every shard has hidden states (distill them with --hidden-states)")
        return _Rows([s.hidden() for s in self.shards if s.num_tokens])

    def sequence(self, i: int) -> tuple[np.ndarray, int]:
        j, local = self._where[i]
        return self.shards[j].sequence(local)

    def __len__(self) -> int:
        return len(self.records)


class ShardWriter:
    """Appends records to a sharded store, a new shard ``shard-NNNNN`` once the last one holds ``shard_tokens``
    tokens; :meth:`create_or_resume` reopens every shard (checking its settings, repairing an interrupted write), so
    the same sequence of appends gives the same shards whether or not it was interrupted. Shards it did not write
    (links to other stores) are read for :meth:`done_ids` and never written."""

    def __init__(self, path: Path, meta: dict, shards: list[DistillStore], others: list, shard_tokens: int):
        self.path, self.meta, self.shards, self.others, self.shard_tokens = path, meta, shards, others, shard_tokens

    @classmethod
    def create_or_resume(cls, path: str | Path, meta: dict, shard_tokens: int = 1 << 20) -> ShardWriter:
        path = Path(path)
        if (path / "meta.json").is_file():
            raise ValueError(f"{path} is one store, not a sharded one; use a new --out directory")
        path.mkdir(parents=True, exist_ok=True)
        dirs = shard_dirs(path)
        mine = [d for d in dirs if d.name.startswith("shard-") and not d.is_symlink()]
        shards = [DistillStore.create_or_resume(d, meta) for d in mine]
        others = [DistillStore.open(d) for d in dirs if d not in mine]
        return cls(path, meta, shards, others, int(shard_tokens))

    @property
    def hidden_size(self) -> int:
        return int(self.meta.get("hidden_size") or 0)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.shards)

    def __len__(self) -> int:
        return sum(len(s) for s in self.shards)

    def done_ids(self) -> set[str]:
        return {r.id for s in self.shards + self.others for r in s.records}

    def append(self, *args, **kwargs) -> Record:
        """:meth:`DistillStore.append` into the last shard, or a new one when the last is full."""
        if not self.shards or self.shards[-1].num_tokens >= self.shard_tokens:
            self.shards.append(DistillStore.create_or_resume(self.path / f"shard-{len(self.shards):05d}", self.meta))
        return self.shards[-1].append(*args, **kwargs)
