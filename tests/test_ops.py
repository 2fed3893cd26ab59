"""Golden values for the pure operations: suffix matching, bigrams, reviews, K-matrices (the lookahead's
are in test_lookahead.py)."""

import pytest
import torch

from hf_cascade.cascade.k_matrix import default_k_matrix, validate_k_matrix
from hf_cascade.core.payoff import DraftPolicy
from hf_cascade.core.review import greedy_review, one_hot_dists, output_distribution, sampling_review
from hf_cascade.core.stats import GenerationStats, PositionCounts
from hf_cascade.drafters.maxgram import BIGRAM_BUCKET, BigramTable, MaxGram, longest_suffix_match


def T(*xs):
    return torch.tensor(xs, dtype=torch.long)


# -- longest_suffix_match ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "seq, max_ngram, expected",
    [
        ((1, 2, 3, 4), 10, (0, -1)),  # no token repeats
        ((3, 7), 10, (0, -1)),
        ((7,), 10, (0, -1)),  # too short
        ((), 10, (0, -1)),
        ((7, 7), 10, (1, 0)),
        ((5, 1, 2, 3, 9, 1, 2, 3), 10, (3, 3)),  # [1 2 3] ended at index 3 before
        ((5, 1, 2, 3, 9, 1, 2, 3), 2, (2, 3)),  # capped by max_ngram
        ((5, 1, 2, 3, 9, 1, 2, 3), 1, (1, 3)),
        ((5, 1, 2, 3, 9, 1, 2, 3), 0, (0, -1)),
        ((1, 2, 7, 1, 2, 8, 1, 2), 10, (2, 4)),  # two occurrences: the most recent one
        ((1, 2, 3, 9, 2, 3, 5, 1, 2, 3), 10, (3, 2)),  # the longest match beats a more recent shorter one
        ((7, 7, 7, 7), 10, (3, 2)),  # self-overlapping run
        ((7, 7, 7, 7), 2, (2, 2)),  # capped: the most recent end of [7 7] is index 2
        ((4, 7, 7, 7, 7, 7), 10, (4, 4)),
        ((1, 2, 1, 2, 1, 2), 10, (4, 3)),  # overlapping periodic match
    ],
)
def test_longest_suffix_match(seq, max_ngram, expected):
    assert longest_suffix_match(T(*seq), max_ngram) == expected


def test_longest_suffix_match_agrees_with_brute_force():
    def brute(s, n):
        L = len(s)
        best = (0, -1)
        for e in range(L - 1):
            m = 0
            while m < n and e - m >= 0 and s[e - m] == s[L - 1 - m]:
                m += 1
            if m > 0 and m >= best[0]:
                best = (m, e)
        return best

    g = torch.Generator().manual_seed(0)
    for trial in range(300):
        L = int(torch.randint(1, 25, (1,), generator=g))
        s = torch.randint(0, 3 if trial % 2 else 6, (L,), generator=g)
        n = int(torch.randint(1, 8, (1,), generator=g))
        assert longest_suffix_match(s, n) == brute(s.tolist(), n), (s.tolist(), n)


# -- BigramTable ------------------------------------------------------------------------------------


def test_bigram_fit_keeps_most_frequent_successor():
    table = BigramTable.fit([[1, 2, 1, 2, 1, 3], [4, 0], [3]], vocab_size=5)
    assert table.next_token.tolist() == [-1, 2, 1, -1, 0]


def test_bigram_fit_accepts_tensors_and_majority_across_sequences():
    table = BigramTable.fit([torch.tensor([0, 1]), torch.tensor([0, 2, 0, 2]), [3, 3]], vocab_size=4)
    assert table.next_token.tolist() == [2, -1, 0, 3]


def test_bigram_fit_empty():
    assert BigramTable.fit([[5], []], vocab_size=3).next_token.tolist() == [-1, -1, -1]


def test_bigram_chain():
    table = BigramTable.fit([[1, 2, 1, 2, 1, 3], [4, 0]], vocab_size=5)
    assert table.chain(1, 5).tolist() == [2, 1, 2, 1, 2]
    assert table.chain(4, 5).tolist() == [0]  # 0 has no successor: stops
    assert table.chain(3, 4).tolist() == []
    assert table.chain(1, 0).tolist() == []
    assert table.chain(-1, 3).tolist() == []
    assert table.chain(99, 3).tolist() == []  # out of range
    assert table.chain(1, 2).dtype == torch.long


def test_maxgram_candidates_and_bigram_fallback():
    mg = MaxGram(max_tokens=3)
    prop = mg.candidates(T(5, 1, 2, 3, 9, 1, 2, 3))
    assert prop.tokens.tolist() == [9, 1, 2] and prop.bucket == 3
    # no match and no bigram table: nothing
    prop = mg.candidates(T(1, 2, 3))
    assert prop.tokens.tolist() == [] and prop.bucket == BIGRAM_BUCKET
    # no match: the bigram table takes over
    mg = MaxGram(max_tokens=3, bigram=BigramTable.fit([[3, 4, 3, 4]], vocab_size=6))
    prop = mg.candidates(T(1, 2, 3))
    assert prop.tokens.tolist() == [4, 3, 4] and prop.bucket == BIGRAM_BUCKET
    # a continuation that runs into the end of the sequence wraps around the period
    prop = MaxGram(max_tokens=10).candidates(T(8, 7, 7))
    assert prop.tokens.tolist() == [7] * 10 and prop.bucket == 1
    prop = MaxGram(max_tokens=7).candidates(T(9, 1, 2, 3, 1, 2, 3))
    assert prop.tokens.tolist() == [1, 2, 3, 1, 2, 3, 1] and prop.bucket == 3
    prop = MaxGram(max_tokens=10).candidates(T(4, 1, 2, 8, 1, 2, 8, 5, 1, 2))
    assert prop.tokens.tolist() == [8, 5, 1, 2, 8, 5, 1, 2, 8, 5]


def test_maxgram_propose_non_adaptive_respects_limit():
    mg = MaxGram(max_tokens=4, adaptive=False)
    policy = DraftPolicy.lookahead(mg)
    seq = T(1, 2, 3, 4, 5, 6, 1, 2)
    assert mg.propose(seq, limit=10, policy=policy).tokens.tolist() == [3, 4, 5, 6]
    assert mg.propose(seq, limit=2, policy=policy).tokens.tolist() == [3, 4]
    assert mg.propose(seq, limit=0, policy=policy).tokens.tolist() == []


def test_maxgram_settings_validation():
    with pytest.raises(ValueError, match="max_tokens >= 1"):
        MaxGram(max_tokens=0)
    with pytest.raises(ValueError, match="max_ngram >= 1"):
        MaxGram(max_ngram=0)


# -- greedy_review ----------------------------------------------------------------------------------


def _logits(*rows):
    return torch.tensor(rows, dtype=torch.float32).log()


def test_greedy_review_all_accepted_gives_bonus():
    logits = _logits([0.1, 0.6, 0.1, 0.2], [0.1, 0.1, 0.5, 0.3], [0.7, 0.1, 0.1, 0.1])
    r = greedy_review(T(1, 2), logits)
    assert r.num_accepted == 2
    assert r.tokens.tolist() == [1, 2, 0]
    torch.testing.assert_close(r.probs, torch.tensor([0.6, 0.5, 0.7]))
    assert r.dists is None


def test_greedy_review_first_rejected():
    logits = _logits([0.1, 0.6, 0.1, 0.2], [0.1, 0.1, 0.5, 0.3], [0.7, 0.1, 0.1, 0.1])
    r = greedy_review(T(3, 2), logits)
    assert r.num_accepted == 0 and r.tokens.tolist() == [1]
    torch.testing.assert_close(r.probs, torch.tensor([0.6]))
    r = greedy_review(T(1, 3), logits)
    assert r.num_accepted == 1 and r.tokens.tolist() == [1, 2]
    # nothing after a rejection is accepted, even if it matches
    r = greedy_review(T(3, 2), logits)
    assert r.num_accepted == 0


def test_greedy_review_no_drafts():
    r = greedy_review(T(), _logits([0.2, 0.3, 0.5]))
    assert r.num_accepted == 0 and r.tokens.tolist() == [2]
    torch.testing.assert_close(r.probs, torch.tensor([0.5]))


# row 1's argmax is 0 (p = 0.5); the draft there is 2 (p = 0.3), drafted with q = 0.8.
LENIENT_LOGITS = [[0.1, 0.6, 0.1, 0.2], [0.5, 0.1, 0.3, 0.1], [0.1, 0.1, 0.1, 0.7]]


@pytest.mark.parametrize(
    "lenience, accepted",
    [(1.0, 1), (2.0, 1), (2.6, 1), (2.7, 2), (3.0, 2), ([1.0, 3.0], 2), ([3.0, 1.0], 1)],
)
def test_greedy_review_lenience_accepts_near_miss(lenience, accepted):
    lenience = torch.tensor(lenience) if isinstance(lenience, list) else lenience
    r = greedy_review(T(1, 2), _logits(*LENIENT_LOGITS), draft_token_probs=torch.tensor([0.9, 0.8]), lenience=lenience)
    # accepted iff lenience * 0.3 >= 0.8
    assert r.num_accepted == accepted
    if accepted == 2:
        assert r.tokens.tolist() == [1, 2, 3]
        torch.testing.assert_close(r.probs, torch.tensor([0.6, 0.3, 0.7]))
    else:
        assert r.tokens.tolist() == [1, 0]
        torch.testing.assert_close(r.probs, torch.tensor([0.6, 0.5]))


def test_greedy_review_lenience_needs_draft_probs():
    r = greedy_review(T(1, 2), _logits(*LENIENT_LOGITS), draft_token_probs=None, lenience=100.0)
    assert r.num_accepted == 1


def test_greedy_review_rejects_lenience_below_one():
    with pytest.raises(ValueError, match="lenience must be >= 1"):
        greedy_review(T(1, 2), _logits(*LENIENT_LOGITS), torch.tensor([0.9, 0.8]), lenience=0.5)


# -- output_distribution / sampling_review -----------------------------------------------------------

Q = torch.tensor([[0.5, 0.3, 0.2]])
P = torch.tensor([[0.2, 0.5, 0.3]])
# lenience 2: accept = min(1, 2p/q) = [0.8, 1, 1]; residual = norm(max(0, p - q/2)) = [0, .35, .2] / .55
ACCEPT_L2 = torch.tensor([[0.8, 1.0, 1.0]])
RESIDUAL_L2 = torch.tensor([[0.0, 0.35 / 0.55, 0.2 / 0.55]])
# emitted: q * accept + (1 - sum(q * accept)) * residual = [.4, .3, .2] + 0.1 * residual
OUT_L2 = torch.tensor([0.4, 0.3 + 0.1 * 0.35 / 0.55, 0.2 + 0.1 * 0.2 / 0.55])


def test_output_distribution_golden():
    accept, residual = output_distribution(Q, P, 2.0)
    torch.testing.assert_close(accept, ACCEPT_L2)
    torch.testing.assert_close(residual, RESIDUAL_L2)
    accept, residual = output_distribution(Q, P, 1.0)
    torch.testing.assert_close(accept, torch.tensor([[0.4, 1.0, 1.0]]))
    torch.testing.assert_close(residual, torch.tensor([[0.0, 0.2, 0.1]]) / 0.3)
    # q = 0 somewhere: accept is 1 there; no residual mass (p == q): residual falls back to p
    q = torch.tensor([[0.0, 0.5, 0.5]])
    accept, residual = output_distribution(q, q.clone(), 1.0)
    torch.testing.assert_close(accept, torch.ones(1, 3))
    torch.testing.assert_close(residual, q)


def test_sampling_review_all_accepted_bonus_from_last_row():
    p = torch.tensor([[0.2, 0.5, 0.3], [0.1, 0.1, 0.8], [0.0, 1.0, 0.0]])
    drafts = T(1, 2)
    r = sampling_review(drafts, p[:2].clone(), p, generator=torch.Generator().manual_seed(0))  # q == p: accept
    assert r.num_accepted == 2
    assert r.tokens.tolist() == [1, 2, 1]
    torch.testing.assert_close(r.dists, p)
    assert r.probs is None


def test_sampling_review_certain_rejection_samples_residual():
    q = torch.tensor([[0.5, 0.5, 0.0]])
    p = torch.tensor([[0.0, 0.2, 0.8], [1.0, 0.0, 0.0]])
    for seed in range(5):
        r = sampling_review(T(0), q, p, generator=torch.Generator().manual_seed(seed))
        assert r.num_accepted == 0
        assert r.tokens.tolist() == [2]  # residual max(0, p - q) = [0, 0, .8]
        torch.testing.assert_close(r.dists, p[:1])  # lossless: the emitted token ~ p


def test_sampling_review_lenient_dists_golden():
    p = torch.cat([P, torch.tensor([[0.0, 0.0, 1.0]])])
    # draft 1: 2 * 0.5 / 0.3 > 1, always accepted; the bonus comes from row 1
    r = sampling_review(T(1), Q.clone(), p, lenience=2.0, generator=torch.Generator().manual_seed(0))
    assert r.num_accepted == 1 and r.tokens.tolist() == [1, 2]
    torch.testing.assert_close(r.dists, torch.stack([OUT_L2, p[1]]))
    # draft 0 (accepted with probability 0.8): the emitted first token has the same distribution
    # whether it was accepted or not
    outcomes = set()
    for seed in range(40):
        r = sampling_review(T(0), Q.clone(), p, lenience=2.0, generator=torch.Generator().manual_seed(seed))
        outcomes.add(r.num_accepted)
        torch.testing.assert_close(r.dists[0], OUT_L2)
        if r.num_accepted == 0:
            assert r.tokens.tolist()[0] in (1, 2) and r.dists.shape == (1, 3)
        else:
            assert r.tokens.tolist() == [0, 2]
    assert outcomes == {0, 1}


@pytest.mark.parametrize("lenience", [1.0, 2.0])
def test_sampling_review_emits_its_declared_distribution(lenience):
    """Empirically: drafts ~ q, the first emitted token ~ dists[0] (= p when lenience is 1)."""
    g = torch.Generator().manual_seed(1234)
    p = torch.cat([P, torch.tensor([[1 / 3, 1 / 3, 1 / 3]])])
    n = 4000
    counts = torch.zeros(3)
    declared = None
    for _ in range(n):
        x = torch.multinomial(Q[0], 1, generator=g)
        r = sampling_review(x, Q.clone(), p, lenience=lenience, generator=g)
        counts[int(r.tokens[0])] += 1
        declared = r.dists[0]
    expected = P[0] if lenience == 1.0 else OUT_L2
    torch.testing.assert_close(declared, expected)
    chi2 = float(((counts - n * expected) ** 2 / (n * expected)).sum())
    assert chi2 < 18.4  # chi2(2 dof) at p = 1e-4


def test_one_hot_dists():
    torch.testing.assert_close(one_hot_dists(T(2, 0), 3), torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]))


# -- K-matrix ------------------------------------------------------------------------------------------


def test_default_k_matrix_values():
    assert default_k_matrix([False, True]) == [[2, 10], [0, 10]]
    assert default_k_matrix([False, False, True]) == [[2, 2, 10], [0, 2, 10], [0, 0, 10]]
    assert default_k_matrix([True]) == [[10]]
    assert default_k_matrix([False]) == [[2]]
    assert default_k_matrix([False, False]) == [[2, 2], [0, 2]]


@pytest.mark.parametrize(
    "k, n",
    [([[1, 5], [0, 3]], 2), ([[4, 0], [0, 1]], 2), ([[0, 10], [0, 0]], 2), ([[3]], 1), ([[1.0, 2.0], [0.0, 1.0]], 2)],
)
def test_validate_k_matrix_accepts(k, n):
    assert validate_k_matrix(k, n) == [[int(x) for x in row] for row in k]


@pytest.mark.parametrize(
    "k, n, message",
    [
        ([[2, 10]], 2, "must be 2x2"),
        ([2, 10], 2, "must be 2x2"),
        ([[2, 10], [0, 10]], 3, "must be 3x3"),
        ([[2, 10], [1, 10]], 2, "upper triangular"),
        ([[2, -1], [0, 10]], 2, ">= 0"),
        ([[1.5, 1], [0, 1]], 2, "whole numbers"),
        ([[0, 0], [0, 10]], 2, "row 0 is all zeros"),
        ([[0]], 1, "row 0 is all zeros"),
        ([[2, 10], [0, 0]], 2, "row 1 is all zeros"),
        ([[2, 2, 10], [0, 0, 0], [0, 0, 10]], 3, "row 1 is all zeros"),
        ([[0, 2, 10], [0, 0, 0], [0, 0, 0]], 3, "row 2 is all zeros"),
    ],
)
def test_validate_k_matrix_errors(k, n, message):
    with pytest.raises(ValueError, match=message):
        validate_k_matrix(k, n)


# -- statistics ----------------------------------------------------------------------------------------


def test_position_counts_and_generation_stats():
    pc = PositionCounts()
    pc.record(3, 1)
    pc.record(1, 1)
    assert pc.proposed == [2, 1, 1] and pc.accepted == [2, 0, 0]
    assert pc.rates() == [1.0, 0.0, 0.0]
    s = GenerationStats()
    s.record_target_review(4, 2)
    s.record_target_review(0, 0)
    assert s.target_calls == 2 and s.new_tokens == 4 and s.tokens_per_target_call == 2.0
    assert s.to_dict()["draft_len_per_call"] == [4, 0]
