"""Frequency-ranked suffix continuations (hf_cascade.drafters.continuations) on hand-made sequences, and
their merge into the recycled expansion as seeds with shares. Exact sampling with them: the contract
(tests/test_contract.py, entry "recycling", whose default counts 16 occurrences)."""

from __future__ import annotations

import pytest

from hf_cascade.drafters.continuations import SeedTrie, suffix_continuations
from hf_cascade.drafters.maxgram import follow, suffix_match, suffix_occurrences
from hf_cascade.recycling import RecycledCandidates, RecyclingShape


def test_occurrences_of_the_longest_suffix_most_recent_first():
    #        0  1  2  3  4  5  6  7  8  9
    seq = [5, 1, 2, 7, 1, 2, 8, 3, 1, 2]
    assert suffix_occurrences(seq, 8, 16) == (2, [5, 2])  # "1 2" ended at 5 and at 2
    assert suffix_occurrences(seq, 8, 1) == (2, [5])
    assert suffix_occurrences(seq, 1, 16) == (1, [5, 2])  # capped at one token: "2" ended at 5, 2
    assert suffix_occurrences([4, 9], 8, 16) == (0, [])
    assert suffix_occurrences(seq, 0, 16) == (0, [])
    # one occurrence: Max-Gram's match, the same end
    for s in ([1, 2, 3, 1, 2], [3, 3, 3, 3], [1, 2, 1, 2, 1]):
        m, ends = suffix_occurrences(s, 8, 1)
        assert (m, ends[0] if ends else -1) == suffix_match(s, 8)


def test_continuations_are_ranked_by_frequency_then_recency():
    #      0  1  2  3  4  5  6  7  8  9 10 11 12
    seq = [9, 1, 4, 6, 9, 1, 5, 9, 1, 4, 7, 9, 1]
    trie = suffix_continuations(seq, 8, depth=2)
    # "9 1" ended at 8, 5, 1 (most recent first): continued 4 7 / 5 9 / 4 6
    assert trie.match == 2
    kids = trie.children[-1]
    assert [(t, round(s, 3)) for t, s, _ in kids] == [(4, 0.667), (5, 0.333)]
    four = kids[0][2]
    assert [(t, s) for t, s, _ in trie.children[four]] == [(7, 0.5), (6, 0.5)]  # a tie: the most recent first
    assert [(t, s) for t, s, _ in trie.children[kids[1][2]]] == [(9, 1.0)]
    assert len(trie) == 5
    # one occurrence: Max-Gram's continuation as one path, wrapping around the period at the end
    one = suffix_continuations(seq, 8, depth=3, max_matches=1)
    assert _path(one) == follow(seq, 8, 3) == [4, 7, 9]
    rep = [3, 4, 3, 4]
    assert _path(suffix_continuations(rep, 8, depth=5)) == [3, 4, 3, 4, 3]
    assert suffix_continuations([1, 2, 3], 8, depth=4).children == {}


def _path(trie: SeedTrie) -> list[int]:
    out, node = [], -1
    while node in trie.children:
        token, share, node = trie.children[node][0]
        assert share == 1.0
        out.append(token)
    return out


def test_expand_takes_seed_siblings_with_their_shares():
    c = RecycledCandidates(top_k=3)
    c.table = {1: ([2], [0.5])}
    trie = SeedTrie(2, {-1: [(3, 0.75, 0), (2, 0.25, 1)], 0: [(8, 1.0, 2)]})
    got = c.expand(1, RecyclingShape(max_nodes=10, max_depth=8), depth=8, seed=trie, seed_estimate=0.8)
    # 3: .8 * .75 = .6; 2: max(.8 * .25, .5) = .5 (recycled and seeded: one node); 8 below 3: .6 * .8 = .48
    assert got.tokens == [3, 2, 8] and got.parents == [-1, -1, 0]
    assert got.estimates == pytest.approx([0.6, 0.5, 0.8])
    assert got.shares == [0.75, 0.25, 1.0] and got.on_seed == [True, True, True]
    assert got.probs == [0.0, 0.5, 0.0]
    # a callable estimate of the share
    got = c.expand(1, RecyclingShape(max_nodes=1, max_depth=8), depth=8, seed=trie, seed_estimate=lambda s: 1 - s)
    assert got.tokens == [2] and got.estimates == [0.75]
