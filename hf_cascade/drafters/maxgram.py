"""Max-Gram (MaG): the statistical drafter at the bottom of the cascade (CS Drafting §3.3, App. A).

MaG finds the longest suffix of the current sequence (prompt and generated text) that occurred
earlier in it and proposes what followed that earlier occurrence. Where the last token never
occurred before, it falls back to a bigram table (the paper's is fitted on Wikipedia; ours is
fitted by :meth:`BigramTable.fit` on any token sequences, e.g. the target's own outputs, and is
optional). With a :class:`~hf_cascade.drafters.corpus.CorpusNGrams` (``corpus=``), a suffix that matched
fewer than ``corpus_below`` tokens of the sequence may be continued from the target's distilled outputs
instead (retrieval-based drafting, REST-style; see that module). With an assistant's
:class:`~hf_cascade.drafters.memory.AnswerMemory` (``Policy(memory=...)``), a longer match in the target's answers of
earlier calls may be continued from there instead (see that module).

Deviations from the paper, and why:
* the match search extends only the earlier occurrences of the last token, most recent first (the
  paper loops over match lengths), and it takes the *most recent* occurrence of the longest match
  (the paper takes the first): generated text tends to repeat what it said last;
* a continuation that runs into the end of the sequence wraps around (the text is repeating with
  that period), so loops are drafted in full;
* the number of proposed tokens adapts (:mod:`hf_cascade.core.payoff.rules`): the paper always
  proposes 10, which on a CPU keeps costing verification time when MaG keeps being rejected.

``MaxGram`` itself is a settings object and holds no per-generation state; the candidate generator
keeps the adaptive statistics for one ``generate()`` call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core.payoff import AdaptiveLookahead, CostModel
from ..placement import HOST, upload
from .corpus import CORPUS_PRIORS, CorpusNGrams
from .memory import MEMORY_PRIORS, AnswerMemory, memory_bucket

BIGRAM_BUCKET = 0


def longest_suffix_match(seq: torch.Tensor, max_ngram: int) -> tuple[int, int]:
    """Longest suffix of ``seq`` (``[L]``) that also ends at an earlier position.

    Returns ``(m, e)``: the suffix ``seq[L-m:]`` equals ``seq[e-m+1 : e+1]`` with ``e <= L-2`` the
    most recent such end, so ``seq[e+1:]`` is what followed it. ``(0, -1)`` when nothing matches.
    ``m`` is capped at ``max_ngram``.
    """
    return suffix_match(seq.tolist(), max_ngram)


def suffix_match(tokens: list[int], max_ngram: int) -> tuple[int, int]:
    """:func:`longest_suffix_match` on a token list: :func:`suffix_occurrences`' most recent one."""
    m, ends = suffix_occurrences(tokens, max_ngram, 1)
    return (m, ends[0]) if ends else (0, -1)


def suffix_occurrences(tokens: list[int], max_ngram: int, max_matches: int) -> tuple[int, list[int]]:
    """``(m, ends)``: the longest suffix of ``tokens`` (at most ``max_ngram``) that ended earlier, and the
    ends ``e <= len(tokens) - 2`` of up to ``max_matches`` of its occurrences, most recent first.

    Only earlier occurrences of the last token can end a match: they are visited most recent first
    (``list.index`` on the reversed list finds each in C) and extended backwards, until ``max_matches``
    matches of ``max_ngram`` tokens or the sequence's start."""
    length = len(tokens)
    if length < 2 or max_ngram < 1 or max_matches < 1:
        return 0, []
    n = min(max_ngram, length - 1)
    rev = tokens[::-1]  # rev[i] = tokens[L-1-i]: the end e = L-1-i
    best, ends, i = 0, [], 0
    while best < n or len(ends) < max_matches:
        try:
            i = rev.index(rev[0], i + 1)  # the next earlier occurrence of the last token
        except ValueError:
            break
        limit = min(n, length - i)  # the match cannot reach before the sequence's start
        if rev[i : i + limit] == rev[:limit]:
            m = limit  # the whole span matches (one comparison in C)
        else:
            m = 1
            while rev[i + m] == rev[m]:  # stops before limit: the spans differ
                m += 1
        if m > best:  # strictly longer: the earlier ends were of a shorter match
            best, ends = m, []
        if m == best and len(ends) < max_matches:
            ends.append(length - 1 - i)
    return best, ends


def follow(tokens: list[int], end: int, k: int) -> list[int]:
    """The ``k`` tokens that followed a match ending at ``end`` (``<= len(tokens) - 2``). Where they run
    into the end of the sequence the text is repeating with period ``len(tokens) - 1 - end``, so the
    continuation wraps around that period."""
    period = len(tokens) - 1 - end
    if period >= k:
        return list(tokens[end + 1 : end + 1 + k])
    return list(tokens[end + 1 :] * (k // period + 1))[:k]  # the period repeated


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists (slice comparisons run in C)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass
class BigramTable:
    """Most frequent successor of every token (``-1`` where unseen)."""

    next_token: torch.Tensor  # [V] long

    @classmethod
    def fit(cls, sequences: list[list[int]] | list[torch.Tensor], vocab_size: int) -> BigramTable:
        """Count bigrams over ``sequences`` and keep the argmax successor of each token."""
        pairs = [torch.as_tensor(s, dtype=torch.long) for s in sequences if len(s) >= 2]
        next_token = torch.full((vocab_size,), -1, dtype=torch.long)
        if not pairs:
            return cls(next_token)
        a = torch.cat([s[:-1] for s in pairs])
        b = torch.cat([s[1:] for s in pairs])
        keys, counts = torch.unique(a * vocab_size + b, return_counts=True)
        # Sort by count, then write: the last write per source token is its most frequent successor.
        order = counts.argsort(stable=True)
        keys = keys[order]
        next_token[keys // vocab_size] = keys % vocab_size
        return cls(next_token)

    def chain(self, last: int, k: int) -> torch.Tensor:
        """Follow the table from ``last`` for up to ``k`` tokens."""
        out: list[int] = []
        tok = last
        for _ in range(k):
            if tok < 0 or tok >= self.next_token.shape[0]:
                break
            tok = int(self.next_token[tok])
            if tok < 0:
                break
            out.append(tok)
        return torch.tensor(out, dtype=torch.long)


@dataclass
class MaxGramProposal:
    tokens: torch.Tensor  # [k]
    bucket: int  # evidence bucket: the match length (capped), BIGRAM_BUCKET, a CORPUS_BUCKETS or MEMORY_BUCKETS value
    host: list[int] | None = None  # ``tokens`` as host ints (Max-Gram drafts on the host: always given by it)


@dataclass
class MaxGram:
    """Max-Gram drafter settings.

    Args:
        max_tokens: most tokens proposed at once (the paper: 10).
        max_ngram: longest suffix match searched for.
        bigram: optional fallback table for tokens never seen before in the sequence.
        adaptive: choose the draft length online (default) or always propose ``max_tokens``.
        cost: fixed :class:`CostModel` for the reviewer (``None``: measured online).
        bucket_priors: prior per-token acceptance per match length (longer matches repeat more).
        corpus: optional corpus n-grams (the target's distilled outputs), consulted when the suffix
            matched fewer than ``corpus_below`` tokens of the sequence; its draft replaces the
            sequence's when its evidence bucket's estimated acceptance is higher (learned per
            ``generate()`` call from the target's verdicts, priors ``CORPUS_PRIORS``).
        corpus_below: see ``corpus``.
        corpus_min_confidence: a corpus draft continues while the next token's corpus frequency is
            at least this.
    """

    max_tokens: int = 10
    max_ngram: int = 10
    bigram: BigramTable | None = None
    adaptive: bool = True
    cost: CostModel | None = None
    bucket_priors: dict[int, float] = field(
        default_factory=lambda: {BIGRAM_BUCKET: 0.2, 1: 0.4, 2: 0.55, 3: 0.7, 4: 0.75, 5: 0.8, 6: 0.85}
    )
    corpus: CorpusNGrams | None = None
    corpus_below: int = 3
    corpus_min_confidence: float = 0.3
    name: str = "maxgram"

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.max_ngram < 1:
            raise ValueError("MaxGram needs max_tokens >= 1 and max_ngram >= 1")
        if self.corpus is not None and not isinstance(self.corpus, CorpusNGrams):
            raise TypeError(f"corpus must be a CorpusNGrams, got {type(self.corpus).__name__}.")
        if self.corpus_below < 0 or not 0.0 <= self.corpus_min_confidence <= 1.0:
            raise ValueError(
                f"MaxGram needs corpus_below >= 0 and corpus_min_confidence in [0, 1], got "
                f"{self.corpus_below}, {self.corpus_min_confidence}."
            )

    def priors(self) -> dict[int, float]:
        """The prior acceptance per evidence bucket its length rule starts from (the corpus's buckets too, where
        it has one, and an answer memory's; the user's ``bucket_priors`` win); the rule itself is the call's
        (:meth:`hf_cascade.core.payoff.DraftPolicy.lookahead`)."""
        corpus = CORPUS_PRIORS if self.corpus is not None else {}
        return {**MEMORY_PRIORS, **corpus, **self.bucket_priors}

    def candidates(self, seq: torch.Tensor) -> MaxGramProposal:
        """What the sequence itself (or the bigram table) offers after ``seq`` (``[L]``), before choosing a
        length; :meth:`propose` may take the corpus's draft instead."""
        host, bucket = self._host_candidates(seq.tolist())
        return MaxGramProposal(torch.tensor(host, dtype=seq.dtype, device=seq.device), bucket, host=host)

    def _host_candidates(self, tokens: list[int]) -> tuple[list[int], int]:
        """What :meth:`candidates` offers after ``tokens``, as host ints, and its evidence bucket."""
        host, bucket, _ = self._sequence_candidates(tokens)
        return host, bucket

    def _sequence_candidates(self, tokens: list[int]) -> tuple[list[int], int, int]:
        """:meth:`_host_candidates` and the match length it continues (0: the bigram table's, or nothing)."""
        m, end = suffix_match(tokens, self.max_ngram)
        if m > 0:
            return follow(tokens, end, self.max_tokens), min(m, 6), m
        if self.bigram is not None and tokens:
            return self.bigram.chain(tokens[-1], self.max_tokens).tolist(), BIGRAM_BUCKET, 0  # a host table
        return [], BIGRAM_BUCKET, 0

    def propose(
        self,
        seq: torch.Tensor,
        limit: int,
        policy: AdaptiveLookahead,
        offset: int = 0,
        tokens: list[int] | None = None,
        memory: AnswerMemory | None = None,
    ) -> MaxGramProposal:
        """Propose at most ``limit`` tokens after ``seq`` (``[L]``), as many as ``policy`` finds worth
        it; ``offset`` tokens from other drafters precede them in the same review. With a corpus, a
        sequence match shorter than ``corpus_below`` gives way to the corpus's chain when the
        corpus bucket's estimated acceptance is higher (or the sequence offers nothing). With a ``memory`` (the
        assistant's answers of earlier calls), a match there longer than the sequence's gives way to what followed
        it when the memory bucket's estimated acceptance is at least the sequence's. ``tokens``: ``seq``
        as host ints when the caller keeps them (the decoding core does): no device read; else ``seq`` is
        read once."""
        if tokens is None:
            tokens = seq.tolist()  # once per draft: the sequence as a list
        host, bucket, m = self._sequence_candidates(tokens)
        if memory is not None:
            recalled, m_memory = memory.recall(tokens, self.max_ngram, self.max_tokens)
            if m_memory > m and policy.acceptance(memory_bucket(m_memory)) >= policy.acceptance(bucket):
                host, bucket = recalled, memory_bucket(m_memory)
        if self.corpus is not None and bucket < self.corpus_below:
            first = self.corpus.match(tokens)  # decide on the first token before chaining
            if (
                first is not None
                and first.confidence >= self.corpus_min_confidence
                and (not host or policy.acceptance(first.bucket) > policy.acceptance(bucket))
            ):
                chain, _ = self.corpus.chain(tokens, self.max_tokens, self.corpus_min_confidence)
                host, bucket = [int(t) for t in chain], first.bucket
        host = host[: policy.choose(bucket, len(host), limit, offset)]
        return MaxGramProposal(upload(torch.tensor(host, dtype=seq.dtype, device=HOST), seq.device), bucket, host=host)
