"""Corpus n-grams: what the target usually says next, counted over its own distilled outputs.

Max-Gram (:mod:`hf_cascade.drafters.maxgram`) looks for the current suffix in the current sequence only.
Where that finds nothing long, :class:`CorpusNGrams` looks for it in a corpus: for every context of
``1 .. max_n`` tokens seen at least ``min_count`` times before a response token of the distillation data
(``hf-cascade distill``: the target's own greedy answers), the most frequent next token, how often it
followed (``count``) and how often the context occurred (``total``). A draft follows the longest known
context token by token.

This is retrieval-based drafting (REST, He et al., 2023, "REST: Retrieval-Based Speculative Decoding"),
with the datastore reduced to the argmax continuation of each context and built from the target's own
outputs (as the cascade's drafters are trained on them), and a generalisation of CS Drafting's bigram
fallback (§3.3, App. A: MaG's bigram table fitted on Wikipedia) to longer contexts. Deviation from
REST: no trie over many continuations and no tree verification; one chain, whose length Max-Gram's
adaptive lookahead chooses from the target's verdicts per evidence bucket (:meth:`CorpusMatch.bucket`).

Saved as safetensors (``contexts.{n}`` ``[K_n, n]``, ``next.{n}``, ``count.{n}``, ``total.{n}`` ``[K_n]``
int32) with the vocabulary size and settings in the metadata.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

#: Evidence buckets of corpus drafts (Max-Gram's own are 0 .. 6): a context of >= 3 tokens or shorter,
#: times the first token's corpus frequency >= 0.8, >= 0.5, or lower.
CORPUS_BUCKETS = {(True, 2): 20, (True, 1): 21, (True, 0): 22, (False, 2): 23, (False, 1): 24, (False, 0): 25}
#: Prior per-token acceptance of each bucket (4 pseudo-observations; the target's verdicts take over during a
#: ``generate()`` call): rounded teacher-forced counts of Gemma-3-270M's corpus on 143 held-out distillation
#: records (a corpus fitted on the other records), where the sequence's own match is shorter than 3 tokens.
CORPUS_PRIORS = {20: 0.7, 21: 0.55, 22: 0.35, 23: 0.5, 24: 0.4, 25: 0.3}


@dataclass(frozen=True)
class CorpusMatch:
    """The corpus's prediction after some tokens: ``token`` followed the last ``n`` tokens ``count`` of
    the ``total`` times that context occurred."""

    token: int
    n: int
    count: int
    total: int

    @property
    def confidence(self) -> float:
        return self.count / self.total

    @property
    def bucket(self) -> int:
        level = 2 if self.confidence >= 0.8 else 1 if self.confidence >= 0.5 else 0
        return CORPUS_BUCKETS[(self.n >= 3, level)]


class CorpusNGrams:
    """Argmax continuation of every frequent context of ``1 .. max_n`` tokens (see the module docstring).

    Args:
        table: context tuple -> ``(next token, count, total)``.
        vocab_size: the vocabulary the token ids belong to (checked against the target's).
        max_n: longest context.
    """

    def __init__(self, table: dict[tuple[int, ...], tuple[int, int, int]], vocab_size: int, max_n: int):
        self.table = table
        self.vocab_size = int(vocab_size)
        self.max_n = int(max_n)

    def __len__(self) -> int:
        return len(self.table)

    def __repr__(self) -> str:
        return f"CorpusNGrams({len(self)} contexts, max_n={self.max_n}, vocab_size={self.vocab_size})"

    # -- fitting -------------------------------------------------------------------------------
    @classmethod
    def fit(
        cls, sequences: Iterable[tuple[Sequence[int], int]], vocab_size: int, max_n: int = 4, min_count: int = 2
    ) -> CorpusNGrams:
        """Count over ``(ids, start)`` pairs: every token ``ids[i]`` with ``i >= start`` (a response
        token) after each of its contexts ``ids[i-n:i]`` (``n = 1 .. max_n``, contexts may reach into
        the prompt). Contexts seen fewer than ``min_count`` times are dropped; ties in the next token
        go to the smallest id (deterministic)."""
        if max_n < 1 or min_count < 1:
            raise ValueError(f"CorpusNGrams needs max_n >= 1 and min_count >= 1, got {max_n}, {min_count}.")
        counts: dict[tuple[int, ...], Counter] = defaultdict(Counter)
        for ids, start in sequences:
            ids = [int(t) for t in ids]
            if any(not 0 <= t < vocab_size for t in ids):
                raise ValueError(f"token ids must lie in [0, {vocab_size}).")
            for i in range(max(int(start), 1), len(ids)):
                for n in range(1, min(max_n, i) + 1):
                    counts[tuple(ids[i - n : i])][ids[i]] += 1
        table = {}
        for ctx, c in counts.items():
            total = sum(c.values())
            if total >= min_count:
                token, count = min(c.items(), key=lambda kv: (-kv[1], kv[0]))
                table[ctx] = (token, count, total)
        return cls(table, vocab_size, max_n)

    @classmethod
    def from_store(
        cls, path: str | Path, vocab_size: int | None = None, max_n: int = 4, min_count: int = 2
    ) -> CorpusNGrams:
        """Fit on the responses of a distillation store (``hf-cascade distill``)."""
        from ..training.store import DistillStore

        store = DistillStore.open(path)
        vocab = int(vocab_size or store.meta.get("vocab_size") or 0)
        if vocab <= 0:
            raise ValueError(f"{path}: the store does not record its vocabulary size; pass vocab_size.")
        return cls.fit((store.sequence(i) for i in range(len(store))), vocab, max_n, min_count)

    # -- drafting ------------------------------------------------------------------------------
    def match(self, tokens: Sequence[int]) -> CorpusMatch | None:
        """The prediction of the longest known context ending ``tokens`` (``None``: none known)."""
        for n in range(min(self.max_n, len(tokens)), 0, -1):
            hit = self.table.get(tuple(tokens[-n:]))
            if hit is not None:
                return CorpusMatch(hit[0], n, hit[1], hit[2])
        return None

    def chain(self, tokens: Sequence[int], k: int, min_confidence: float = 0.0) -> tuple[list[int], CorpusMatch | None]:
        """Up to ``k`` tokens, each the prediction after ``tokens`` and the chain so far, while its
        confidence is at least ``min_confidence``; and the first token's match (``None``: no draft)."""
        ctx, out, first = list(tokens[-self.max_n :]), [], None
        for _ in range(k):
            m = self.match(ctx)
            if m is None or m.confidence < min_confidence:
                break
            first = first or m
            out.append(m.token)
            ctx = ctx[1:] + [m.token] if len(ctx) >= self.max_n else ctx + [m.token]
        return out, first

    # -- files ---------------------------------------------------------------------------------
    def save(self, path: str | Path, **metadata) -> None:
        """Write ``path`` (safetensors; ``metadata``: extra strings, e.g. the data it was fitted on)."""
        from safetensors.torch import save_file

        tensors = {}
        for n in range(1, self.max_n + 1):
            rows = [(ctx, v) for ctx, v in self.table.items() if len(ctx) == n]
            ctx = np.array([c for c, _ in rows], dtype=np.int32).reshape(len(rows), n)
            val = np.array([v for _, v in rows], dtype=np.int32).reshape(len(rows), 3)
            tensors[f"contexts.{n}"] = torch.from_numpy(ctx)
            for j, name in enumerate(("next", "count", "total")):
                tensors[f"{name}.{n}"] = torch.from_numpy(np.ascontiguousarray(val[:, j]))
        meta = {"format": "hf_cascade.corpus_ngrams", "vocab_size": str(self.vocab_size), "max_n": str(self.max_n)}
        meta.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()})
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(path), metadata=meta)

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        filename: str = "corpus.safetensors",
        revision: str | None = None,
        token: str | bool | None = None,
        cache_dir: str | Path | None = None,
    ) -> CorpusNGrams:
        """Read a file written by :meth:`save` (``ValueError`` for anything else). ``path``: the file, a local
        directory holding ``filename``, or a Hub repo id (``filename`` of the repo at ``revision``, through
        ``huggingface_hub.hf_hub_download``: the local Hub cache first, ``HF_HUB_OFFLINE`` honoured)."""
        from safetensors import safe_open

        from ..loading import resolve_file

        path = resolve_file(path, filename, revision=revision, token=token, cache_dir=cache_dir, kind="corpus")
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != "hf_cascade.corpus_ngrams":
                raise ValueError(f"{path} is not an hf_cascade corpus n-gram file.")
            vocab_size, max_n = int(meta["vocab_size"]), int(meta["max_n"])
            table = {}
            for n in range(1, max_n + 1):
                ctx = f.get_tensor(f"contexts.{n}")
                if ctx.ndim != 2 or ctx.shape[1] != n:
                    raise ValueError(f"{path}: contexts.{n} has shape {tuple(ctx.shape)}, expected [K, {n}].")
                cols = [f.get_tensor(f"{name}.{n}").tolist() for name in ("next", "count", "total")]
                table.update(zip(map(tuple, ctx.tolist()), zip(*cols)))
        return cls(table, vocab_size, max_n)


__all__ = ["CORPUS_BUCKETS", "CORPUS_PRIORS", "CorpusMatch", "CorpusNGrams"]
