"""Frequency-ranked continuations of the sequence's longest repeated suffix: a small tree of what followed
*every* earlier occurrence of that suffix, each branch with its share of the occurrences (SuffixDecoding,
Oliaro et al., 2024: a suffix tree's continuations scored by their empirical frequency).

Max-Gram copies the continuation of the *most recent* occurrence only. Under greedy decoding that is the
right single guess (the text repeats what it said last). Under sampling the target draws one of several
continuations; a tree of the continuations seen after the same context, ranked by how often each was seen,
offers several candidates per position, which the exact multi-candidate acceptance (recursive rejection
over siblings) can use.

Deviations from SuffixDecoding (and why): the tree is built per step from the current sequence only (the
prompt and the generated text, no global cache of earlier responses: a call's output never depends on
earlier calls), over the occurrences of the *longest* matching suffix (the most specific context; the
paper scores every suffix length), with at most ``max_matches`` of them, most recent first (a bound on the
host work per step). A continuation that runs into the end of the sequence wraps around its period, as
Max-Gram's does. (:class:`~hf_cascade.maxgram_tree.MaxGramTree` is the unweighted cousin:
distinct continuations by recency, over shorter suffixes too, for a tree of its own.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .maxgram import follow, suffix_occurrences


@dataclass
class SeedTrie:
    """Candidate continuations below the last token: ``children[node]`` lists ``(token, share, child)`` in
    decreasing share (ties: the most recent occurrence first); node ``-1`` is the root (the last token).
    ``share``: the fraction of the occurrences through ``node`` that continued with ``token``. ``match``: the
    length of the suffix the occurrences share (0: no tree)."""

    match: int = 0
    children: dict[int, list[tuple[int, float, int]]] = field(default_factory=dict)

    @classmethod
    def path(cls, tokens: list[int], match: int = 1) -> SeedTrie:
        """One continuation, every share 1."""
        trie = cls(match if tokens else 0)
        for i, t in enumerate(tokens):
            trie.children[i - 1] = [(int(t), 1.0, i)]
        return trie

    def __len__(self) -> int:
        return sum(len(kids) for kids in self.children.values())


def suffix_continuations(tokens: list[int], max_ngram: int, depth: int, max_matches: int = 16) -> SeedTrie:
    """The :class:`SeedTrie` of the ``depth`` tokens that followed each occurrence of the longest repeated
    suffix (:func:`suffix_occurrences`)."""
    m, ends = suffix_occurrences(tokens, max_ngram, max_matches)
    if not ends or depth < 1:
        return SeedTrie(m)
    continuations = []
    last = len(tokens) - 1
    for end in ends:  # most recent first: ties keep that order
        if last - end >= depth:  # no wrap-around: follow()'s slice, made here
            continuations.append(tuple(tokens[end + 1 : end + 1 + depth]))
        else:
            continuations.append(tuple(follow(tokens, end, depth)))
    return continuation_trie(m, continuations)


def continuation_trie(match: int, continuations: list[tuple[int, ...]]) -> SeedTrie:
    """The :class:`SeedTrie` of ``continuations`` (non-empty, each what followed one occurrence of a ``match``-token
    suffix, most recent first), ranked by how many occurrences each branch continues."""
    seen: dict[tuple[int, ...], int] = {}  # continuation -> its occurrences, in order of first sight
    for continuation in continuations:
        seen[continuation] = seen.get(continuation, 0) + 1
    if len(seen) == 1:  # every occurrence continued alike: one path, shares 1
        return SeedTrie.path(list(continuations[0]), match)  # (the numbering below gives the same nodes)
    trie = SeedTrie(match)
    kids_of: dict[int, dict[int, int]] = {}  # node -> token -> child id (in order of first sight)
    through: list[int] = []  # child id -> occurrences through it
    for continuation, count in seen.items():  # a repeated continuation walked once
        node = -1
        for token in continuation:
            kids = kids_of.setdefault(node, {})
            if token not in kids:
                kids[token] = len(through)
                through.append(0)
            node = kids[token]
            through[node] += count
    for node, kids in kids_of.items():
        total = len(continuations) if node == -1 else through[node]
        ranked = sorted(kids.items(), key=lambda kv: -through[kv[1]])  # stable: recency among equal counts
        trie.children[node] = [(token, through[child] / total, child) for token, child in ranked]
    return trie


class SeedRates:
    """How often the target accepts seed tokens, learned in one ``generate()`` call, per length bucket of the
    match they continue (1, 2, 3, 4+ tokens: a token after a long match is accepted far more often): a seed
    token of share ``s`` is estimated at ``rate_b * s``, ``rate_b = (accepted + 1) / (reached shares + 2)``
    (for one path: a Beta(1, 1) prior), capped below 1 so that no seed token is estimated certain."""

    def __init__(self) -> None:
        self.hits: dict[int, list[float]] = {}  # bucket -> [accepted, sum of the reached seeds' shares]

    @staticmethod
    def bucket(match: int) -> int:
        return min(match, 4)

    def rate(self, bucket: int) -> float:
        """Accepted seed tokens per unit of reached share (a ratio: low-share branches accepted more often than
        their share can lift it above 1, hence the cap)."""
        hits, reached = self.hits.get(bucket, (1.0, 2.0))
        return min(hits / reached, 0.999)

    def observe(self, bucket: int, share: float, accepted: bool) -> None:
        """A seed token of ``share`` that the target reached (its parent was accepted) and accepted or not."""
        hits = self.hits.setdefault(bucket, [1.0, 2.0])
        hits[0] += float(accepted)
        hits[1] += share


__all__ = ["SeedRates", "SeedTrie", "continuation_trie", "suffix_continuations"]
