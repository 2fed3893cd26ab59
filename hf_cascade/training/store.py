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
    def create_or_resume(cls, path: str | Path, meta: dict) -> "DistillStore":
        """Open ``path`` for appending; a new store gets ``meta``. An existing store must have been
        made with the same settings (``ValueError`` otherwise) and is truncated to its last record."""
        path = Path(path)
        if (path / "meta.json").is_file():
            store = cls.open(path, repair=True)
            keys = ("target", "prompt_format", "max_new_tokens", "hidden_size")
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
    def open(cls, path: str | Path, repair: bool = False) -> "DistillStore":
        """Open an existing store for reading (``repair``: truncate torn writes of an interrupt)."""
        path = Path(path)
        if not (path / "meta.json").is_file():
            raise FileNotFoundError(f"{path} is not a distillation directory (no meta.json); run `hf-cascade distill` first")
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
    def append(self, id: str, source: str, prompt_ids, response_ids, eos: bool, hidden: np.ndarray | None = None) -> Record:
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

    def absorb(self, part: "DistillStore") -> int:
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
        return np.memmap(self.path / "hidden.bin", dtype=np.float16, mode="r", shape=(self.num_tokens, self.hidden_size))

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
