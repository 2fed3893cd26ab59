"""Answer memory: the target's verified outputs of an assistant's earlier calls, as a draft source.

Max-Gram (:mod:`hf_cascade.drafters.maxgram`) and the lookup branch (:mod:`hf_cascade.drafters.lookup_branch`)
find the current suffix in the current sequence only. Agents and pipelines send separate calls whose answers
repeat what earlier answers said (a tool's output, a file, a paragraph reworked), without that answer in the
prompt. :class:`AnswerMemory` keeps the emitted tokens of the earlier calls (the prompt is not stored: the call's
own sequence already holds it) and finds in them the longest suffix of the current sequence, most recent answer
first; what followed it there is a draft, judged by the call's policy like any other (its own evidence buckets and
priors, :data:`MEMORY_BUCKETS`).

SuffixDecoding (Oliaro et al., 2024, arXiv:2411.04975) drafts from a global suffix tree over earlier responses
shared across requests; this is that idea reduced to Max-Gram's rule. Deviations, and why: a hash index of each
``key``-token context (the occurrences of the last ``key`` tokens, extended backwards; at most ``max_matches``
visited, most recent first) instead of a suffix tree (no tree to rebalance when the oldest answer is evicted: its
entries are the oldest of every list); the most recent occurrence of the longest match, not the most frequent
continuation (as Max-Gram); a match never spans two answers.

Bounded: at most ``max_tokens`` tokens are kept (the oldest answers evicted first; an answer longer than the limit
keeps its last ``max_tokens``), and the index holds one entry per kept token. Thread-safe: one lock around every
read and write, so several threads of a pipeline may call one assistant. A draft depends on the context and on
the memory's content before the step, never on the step's random draws: greedy output equals plain ``generate``
with or without memory, and sampling stays exact (a drafted token's ``q`` is a point mass, as Max-Gram's).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

#: Evidence buckets of memory drafts, by match length (Max-Gram's own are 0 .. 6, the corpus's 20 .. 25).
MEMORY_BUCKETS = {m: 30 + m for m in range(1, 7)}
#: Prior per-token acceptance of each bucket: Max-Gram's own priors by match length (an earlier answer is text the
#: target wrote, as the sequence's own repeats are); the target's verdicts take over during a call.
MEMORY_PRIORS = {31: 0.4, 32: 0.55, 33: 0.7, 34: 0.75, 35: 0.8, 36: 0.85}


def memory_bucket(match: int) -> int:
    """The evidence bucket of a memory draft after a match of ``match`` tokens."""
    return MEMORY_BUCKETS[min(max(match, 1), 6)]


class AnswerMemory:
    """The target's outputs of earlier calls, indexed for suffix lookup (see the module docstring).

    Args:
        max_tokens: most tokens kept, over all answers (the oldest answers are evicted first).
        key: tokens of context indexed; a memory match has at least ``key`` tokens.
        max_matches: most occurrences of the last ``key`` tokens visited per lookup, most recent first (a bound on
            the host work per draft).
    """

    def __init__(self, max_tokens: int = 100_000, key: int = 2, max_matches: int = 32):
        if max_tokens < 1 or key < 1 or max_matches < 1:
            raise ValueError(
                f"AnswerMemory needs max_tokens, key and max_matches >= 1, got {max_tokens}, {key}, {max_matches}."
            )
        self.max_tokens, self.key, self.max_matches = int(max_tokens), int(key), int(max_matches)
        self._lock = threading.Lock()
        self._answers: deque[tuple[int, list[int]]] = deque()  # (serial, tokens), oldest first
        self._by_serial: dict[int, list[int]] = {}
        self._index: dict[tuple[int, ...], deque[tuple[int, int]]] = {}  # context -> (serial, end), oldest first
        self._tokens = 0
        self._serial = 0

    def __len__(self) -> int:
        """Tokens kept."""
        return self._tokens

    @property
    def answers(self) -> int:
        """Answers kept."""
        return len(self._answers)

    @property
    def entries(self) -> int:
        """Index entries (at most one per kept token)."""
        with self._lock:
            return sum(len(d) for d in self._index.values())

    def __repr__(self) -> str:
        return f"AnswerMemory({self.answers} answers, {len(self)} of {self.max_tokens} tokens)"

    # -- writing -------------------------------------------------------------------------------
    def add(self, tokens: Iterable[int]) -> None:
        """Remember one answer (the emitted tokens of one call), evicting the oldest answers beyond the limit. An
        answer too short to continue any indexed context is not kept."""
        tokens = [int(t) for t in tokens][-self.max_tokens :]
        if len(tokens) <= self.key:
            return
        with self._lock:
            while self._answers and self._tokens + len(tokens) > self.max_tokens:
                self._evict()
            serial, self._serial = self._serial, self._serial + 1
            self._answers.append((serial, tokens))
            self._by_serial[serial] = tokens
            self._tokens += len(tokens)
            for context, end in self._contexts(tokens):
                self._index.setdefault(context, deque()).append((serial, end))

    def forget(self) -> None:
        """Forget every answer."""
        with self._lock:
            self._answers.clear()
            self._by_serial.clear()
            self._index.clear()
            self._tokens = 0

    def _contexts(self, tokens: list[int]):
        """Each indexed ``(context, end)`` of an answer: the ``key`` tokens ending at ``end``, for every end that a
        token follows."""
        key = self.key
        for end in range(key - 1, len(tokens) - 1):
            yield tuple(tokens[end - key + 1 : end + 1]), end

    def _evict(self) -> None:
        """Drop the oldest answer: its entries are the oldest of each of its contexts' lists."""
        serial, tokens = self._answers.popleft()
        del self._by_serial[serial]
        self._tokens -= len(tokens)
        for context, _ in self._contexts(tokens):
            entries = self._index[context]
            entries.popleft()
            if not entries:
                del self._index[context]

    # -- reading -------------------------------------------------------------------------------
    def occurrences(
        self, tokens: list[int], max_ngram: int, max_matches: int | None = None
    ) -> tuple[int, list[tuple[list[int], int]]]:
        """``(m, ends)``: the longest suffix of ``tokens`` (at least ``key``, at most ``max_ngram`` tokens) found in
        the memory with a token after it, and up to ``max_matches`` (default: 1) of its occurrences as ``(answer,
        end)`` (the answer's tokens, the match's last position), most recent first. ``(0, [])``: none."""
        key, want = self.key, max_matches or 1
        if len(tokens) < key or max_ngram < key:
            return 0, []
        with self._lock:
            entries = self._index.get(tuple(tokens[-key:]))
            if not entries:
                return 0, []
            best, found, visited = 0, [], 0
            limit = min(max_ngram, len(tokens))
            for serial, end in reversed(entries):  # most recent first
                answer = self._by_serial[serial]
                m, reach = key, min(limit, end + 1)
                while m < reach and answer[end - m] == tokens[-1 - m]:
                    m += 1
                if m > best:
                    best, found = m, []
                if m == best and len(found) < want:
                    found.append((answer, end))
                visited += 1
                if visited >= self.max_matches or (best >= limit and len(found) >= want):
                    break
            return best, found

    def recall(self, tokens: list[int], max_ngram: int, k: int) -> tuple[list[int], int]:
        """Up to ``k`` tokens that followed the most recent occurrence of the longest suffix of ``tokens`` in the
        memory (:meth:`occurrences`), and that match's length (``([], 0)``: none)."""
        m, found = self.occurrences(tokens, max_ngram)
        if not found:
            return [], 0
        answer, end = found[0]
        return answer[end + 1 : end + 1 + k], m


__all__ = ["MEMORY_BUCKETS", "MEMORY_PRIORS", "AnswerMemory", "memory_bucket"]
