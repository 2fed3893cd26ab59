"""Golden tensors for hf_cascade.core.draws: the rows a drawn tree hands to verification."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
)

from hf_cascade.core.draws import ProposalChoice, draw, keep_drawn, tree_draft_probs, warpers
from hf_cascade.core.structure import TokenTree


def test_draw_hands_the_processed_distribution_it_draws_from():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    processors = LogitsProcessorList([TemperatureLogitsWarper(0.5), TopKLogitsWarper(2)])
    expected = torch.tensor([4.0, 2.0]).softmax(-1)  # logits / 0.5, the two best kept
    counts = torch.zeros(4)
    torch.manual_seed(0)
    for _ in range(4000):
        token, q = draw(processors, logits)
        counts[int(token)] += 1
    assert torch.allclose(q, torch.cat([expected, torch.zeros(2)]), atol=1e-6)
    assert counts[2:].sum() == 0
    assert abs(counts[0] / 4000 - float(expected[0])) < 0.03  # 6 sigma of a binomial(4000, 0.88)
    _, raw = draw(LogitsProcessorList(), logits)  # no warpers: the softmax itself
    assert torch.allclose(raw, logits.softmax(-1))


def test_warpers_keep_the_sequence_free_processors_in_order():
    t, k, rep = TemperatureLogitsWarper(0.7), TopKLogitsWarper(5), RepetitionPenaltyLogitsProcessor(1.2)
    assert list(warpers(LogitsProcessorList([rep, t, k]))) == [t, k]
    assert len(warpers(None)) == 0


def test_tree_draft_probs_golden():
    # main path 5 -> 6 (nodes 0, 1) drawn; node 2 (token 3) a sibling of node 0, node 3 (token 1) of node 1
    tree = TokenTree(torch.tensor([5, 6, 3, 1]), torch.tensor([-1, 0, -1, 0]))
    drawn = torch.tensor([[0.0, 0.0, 0.0, 0.2, 0.0, 0.5, 0.3, 0.0], [0.0, 0.1, 0.0, 0.0, 0.0, 0.0, 0.9, 0.0]])
    out = tree_draft_probs(tree, drawn)
    expected = torch.zeros(4, 8)
    expected[:2] = drawn
    expected[2, 3] = 1.0
    expected[3, 1] = 1.0
    assert torch.equal(out, expected)
    assert torch.equal(tree_draft_probs(tree.select(torch.tensor([True, True, False, False])), drawn), drawn)
    # a reduced vocabulary: column j of the drawn rows is target id columns[j]
    reduced = torch.tensor([[0.25, 0.75], [1.0, 0.0]])
    out = tree_draft_probs(tree, reduced, vocab_size=8, columns=torch.tensor([5, 6]))
    assert out[0].tolist() == [0, 0, 0, 0, 0, 0.25, 0.75, 0] and out[1].tolist() == [0, 0, 0, 0, 0, 1.0, 0, 0]
    assert out[2].tolist() == [0, 0, 0, 1.0, 0, 0, 0, 0] and out[3].tolist() == [0, 1.0, 0, 0, 0, 0, 0, 0]


def test_keep_drawn_keeps_the_drawn_path_whatever_the_budget_chose():
    assert keep_drawn([True, False, False, True, False], 2) == [True, True, False, True, False]
    assert keep_drawn([False, False, True], 0) == [False, False, True]


def test_proposal_choice_draws_only_while_draws_are_accepted_more_often():
    choice = ProposalChoice(decay=0.5)
    assert not choice.draws()  # starts with the argmax
    p = torch.tensor([0.4, 0.3, 0.3, 0.0])
    # q close to p: a draw is accepted with sum min(p, q) = 0.9, the argmax (token 0) with p = 0.4
    choice.observe(p, torch.tensor([0.5, 0.3, 0.2, 0.0]))
    assert abs(choice.rate[-1]["argmax"] - 0.4) < 1e-6 and abs(choice.rate[-1]["draw"] - 0.9) < 1e-6
    assert choice.draws()
    # a spread q whose argmax the target likes: argmax 0.9 against overlap 0.3 + 0.05 + 0.05 = 0.4
    sharp = torch.tensor([0.9, 0.05, 0.05, 0.0])
    for _ in range(3):
        choice.observe(sharp, torch.tensor([0.3, 0.25, 0.25, 0.2]))
    assert not choice.draws()
    # a reduced vocabulary: q's columns are target ids 2 and 0
    reduced = ProposalChoice()
    reduced.observe(p, torch.tensor([0.2, 0.8]), columns=torch.tensor([2, 0]))
    assert abs(reduced.rate[-1]["argmax"] - 0.4) < 1e-6 and abs(reduced.rate[-1]["draw"] - 0.6) < 1e-6


def test_proposal_choice_expects_the_first_level_acceptance_exactly():
    """The draw's expected first-level acceptance (the docstring's closed form) against enumeration over every
    draw ``x``: accepted with ``min(1, p(x) / q(x))``, else its ``K`` siblings (the best of ``q`` other than ``x``)
    tried in turn as point masses against the residual, which accept with the residual's mass on them."""
    torch.manual_seed(0)
    for k in range(4):
        p, q = torch.rand(12) ** 3, torch.rand(12) ** 2
        p, q = p / p.sum(), q / q.sum()
        choice = ProposalChoice()
        choice.observe(p, q, siblings=k)
        top = q.topk(k + 1).indices.tolist()
        residual = (p - q).clamp_min(0.0)
        residual = residual / residual.sum()
        expected = 0.0
        for x in range(12):
            accept = min(1.0, float(p[x] / q[x]))
            siblings = [t for t in top if t != x][:k]
            expected += float(q[x]) * (accept + (1 - accept) * float(residual[siblings].sum()))
        assert abs(choice.rate[-1]["draw"] - expected) < 1e-5, (k, choice.rate, expected)
        assert abs(choice.rate[-1]["argmax"] - float(p[top].sum())) < 1e-6


def test_proposal_choice_keeps_one_choice_per_confidence_bucket():
    choice = ProposalChoice(bounds=(0.5,))
    assert choice.table("cpu") is None
    near, sharp = torch.tensor([0.4, 0.3, 0.3, 0.0]), torch.tensor([0.95, 0.05, 0.0, 0.0])
    choice.observe(near, torch.tensor([0.5, 0.3, 0.2, 0.0]), confidence=0.45)  # bucket 0: a draw is ahead
    choice.observe(sharp, torch.tensor([0.6, 0.2, 0.1, 0.1]), confidence=0.9)  # bucket 1: the argmax is
    assert choice.draws(0.45) and choice.draws(0.5) and not choice.draws(0.9)  # 0.5 lies in (0, 0.5]
    assert choice.table("cpu").tolist() == [True, False]
    bounds = torch.tensor(choice.bounds)
    assert [choice.table("cpu")[torch.bucketize(torch.tensor(c), bounds)].item() for c in (0.2, 0.5, 0.51)] == [
        True,
        True,
        False,
    ]


def test_categorical_draws_with_the_entries_probabilities():
    from hf_cascade.core.categorical import categorical

    probs = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.3, 0.0])
    gen = torch.Generator().manual_seed(0)
    counts = torch.bincount(torch.stack([categorical(probs, gen) for _ in range(6000)]), minlength=6).float()
    assert counts[[0, 2, 5]].sum() == 0  # no mass, never drawn
    assert torch.allclose(counts / 6000, probs, atol=0.025)  # > 3.5 sigma of each binomial
    assert int(categorical(torch.tensor([0.0, 0.0, 2.0, 0.0]))) == 2  # any positive total; a single mass
    assert categorical(probs).dim() == 0


def test_proposal_choice_deferred_measures_settle_to_the_same_rates():
    """``observe(defer=True)`` keeps the measure on the device; :meth:`settle` with the values the caller read
    leaves the rates exactly where reading at once does (the accelerator schedule folds them into the next draft's
    read)."""
    torch.manual_seed(3)
    now, later = ProposalChoice(decay=0.5), ProposalChoice(decay=0.5)
    steps = [(torch.rand(6).softmax(-1), torch.rand(6).softmax(-1), c) for c in (0.2, 0.9, 0.5)]
    for p, q, c in steps:
        now.observe(p, q, siblings=1, confidence=c)
        later.observe(p, q, siblings=1, confidence=c, defer=True)
    assert later.rate != now.rate and later.pending().shape == (6,)
    later.settle(later.pending().tolist())
    assert later.rate == now.rate and later.pending() is None
    later.observe(*steps[0][:2], defer=True)
    with pytest.raises(ValueError, match="3 values for 1 pending"):
        later.settle([0.1, 0.2, 0.3])
