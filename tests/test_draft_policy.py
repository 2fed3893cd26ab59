"""The call's draft policy (hf_cascade.core.payoff.DraftPolicy): with ``cost_aware`` off it answers as the papers
draft (everything the settings allow, every node verified, every consultation); with it on, its answers are its
rules' (AdaptiveBudget, DrafterPayoff, ExpectedGainRule), step for step. The rules' own golden values:
tests/test_tree_budget.py, tests/test_lookahead.py, tests/test_adapt.py."""

from __future__ import annotations

import pytest
import torch

from hf_cascade import MaxGram, Policy
from hf_cascade.core import TokenTree
from hf_cascade.core.payoff import AdaptiveBudget, DrafterPayoff, DraftPolicy, ExpectedGainRule, VerifyCost

TREE = TokenTree.from_host([5, 6, 7, 8], [-1, 0, -1, 2], torch.device("cpu"))
STEEP = VerifyCost((1.0, 1.5, 2.0, 2.5, 3.0))


def test_paper_policy_drafts_and_verifies_everything():
    paper = DraftPolicy.of(Policy.paper(), STEEP)
    assert paper.budget is None and paper.payoff is None and not paper.lookup and not paper.reads_scores
    assert [paper.plan(k) for k in (0, 1, 5)] == [0, 1, 5]
    assert paper.select(TREE, [0.01] * 4) == (TREE, [])
    assert paper.keep(TREE, [0.01] * 4) == [True] * 4
    assert paper.deeper(1e-9) and paper.consult(1e-9) and paper.token_rule(lambda: [0.5]) is None
    assert paper.calibrated(0.3) == 0.3


@pytest.mark.measured_costs  # the rules as users get them (hand-fed times)
def test_cost_aware_policy_answers_as_its_rules():
    """Twin rules fed the same measurements give the same decisions: whether and how deep to draft (an exploring
    step drafts ``explore_tokens``), which nodes pay, whether a consultation pays, the token floor."""
    policy, twin = DraftPolicy.of(Policy(), STEEP), AdaptiveBudget(STEEP)
    assert policy.lookup and policy.reads_scores  # Policy() joins the lookup branch, cut by it
    for step in range(20):  # rejected drafts: drafting stops paying
        planned, drafts = policy.plan(4), twin.should_draft()
        assert planned == (twin.draft_limit(4) if drafts else 0), step
        for rule in (policy, twin):
            (rule.observe if rule is policy else rule.observe_step)(TREE, [0.9] * 4, [], 1, 0.01)
    assert policy.plan(4) == 0 and policy.budget.first_acceptance() == twin.first_acceptance()
    probs = [0.9, 0.2, 0.6, 0.05]
    assert policy.keep(TREE, probs) == twin.keep(TREE, probs)
    assert policy.select(TREE, probs)[1] == twin.select(TREE, probs)[1]

    payoff = DrafterPayoff()
    for rule in (policy, payoff):
        rule.observe_consult(0.5, 0.2)
        rule.observe_verdict(0, 1, 0.01)
    refusals = [payoff.worth(0.5) for _ in range(8)]
    assert [policy.consult(0.5) for _ in range(8)] == refusals == [False] * 7 + [True]  # every 8th explores
    floor = policy.token_rule(lambda: [0.9, 0.5])
    assert floor.floor() == pytest.approx(
        ExpectedGainRule.after([0.9, 0.5], policy.target_cost, policy.calibration).floor()
    )


def test_lookahead_from_the_drafters_declared_shape():
    rule = DraftPolicy.lookahead(MaxGram(max_tokens=4, adaptive=False, bucket_priors={3: 0.9}))
    assert rule.max_tokens == 4 and not rule.adaptive and rule.acceptance(3) == pytest.approx(0.9)
    assert rule.choose(3, 10) == 4
