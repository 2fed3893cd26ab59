"""NeuralLevel's list-based drafting: greedy drafts over the reduced vocabulary (tokens and
probabilities as Python numbers, the probability floor compared in float32) equal the full-row path's,
and the bookkeeping helpers agree with their tensor definitions."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import LogitsProcessorList

from hf_cascade.core.payoff import AcceptanceCalibration, CostModel, ExpectedGainRule
from hf_cascade.core.stats import LevelStats
from hf_cascade.drafters.maxgram import common_prefix
from hf_cascade.drafters.neural import NeuralLevel, _as_float32
from tests import tiny_models as tm
from tests.test_drafter_head import EVEN, make_drafter
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)


@pytest.mark.parametrize("rule", [False, True])
def test_greedy_reduced_drafts_equal_the_full_row_path(rule):
    """Same tokens, same probabilities (to float rounding), same stops: drafting across several calls that
    share one cache (rollbacks included), with and without the cost rule's probability floor."""
    model = make_drafter(seed=5)
    fast = NeuralLevel(model, tm.VOCAB, LogitsProcessorList(), LevelStats("fast"))
    full = NeuralLevel(model, tm.VOCAB, LogitsProcessorList(), LevelStats("full"))
    full._greedy_reduced = lambda: False  # full-vocabulary rows
    assert fast._greedy_reduced()
    calibration = AcceptanceCalibration()
    for p, hit in [(0.3, False), (0.5, True), (0.7, False), (0.9, True)]:
        calibration.observe(p, hit)
    seq = torch.tensor([1, 4, 6, 8, 4, 6])

    def make_rule(call):
        return ExpectedGainRule.after([0.6] * (call % 3), CostModel(measure=False), calibration) if rule else None

    for call in range(12):
        got = fast.generate(seq, 4, False, set(), rule=make_rule(call))
        expected = full.generate(seq, 4, False, set(), rule=make_rule(call))
        assert got[0].tolist() == expected[0].tolist(), f"call {call}"
        torch.testing.assert_close(got[1], expected[1], rtol=1e-6, atol=1e-7)  # softmax over N vs V: last bits
        # the target accepts a prefix and adds its own token; sometimes a different one
        keep = call % (got[0].shape[0] + 1)
        seq = torch.cat([seq, got[0][:keep], torch.tensor([2 * (call % 40) + 2])])
    assert fast.stats.forward_calls == full.stats.forward_calls


def test_float32_floor_matches_the_tensor_comparison():
    """``p >= _as_float32(floor)`` on Python floats is what ``q_tok >= floor`` is on a float32 tensor."""
    g = torch.Generator().manual_seed(0)
    q = torch.rand(2000, generator=g)
    for floor in [0.7, 0.3, 0.1, 1 / 3, 0.0, 1.0, *torch.rand(20, generator=g, dtype=torch.float64).tolist()]:
        nearest = float(torch.tensor(floor, dtype=torch.float32))  # q values at the rounding edge
        for value in [*q.tolist(), nearest, *torch.tensor([nearest]).nextafter(torch.tensor([2.0])).tolist()]:
            tensor_says = bool(torch.tensor(value, dtype=torch.float32) >= floor)
            assert tensor_says == (value >= _as_float32(floor)), (value, floor)
    assert _as_float32(1e300) == float("inf")


def test_common_prefix_of_token_lists():
    rng = random.Random(0)
    for _ in range(500):
        a = [rng.randrange(3) for _ in range(rng.randrange(12))]
        b = a[: rng.randrange(len(a) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(5))]
        expected = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert common_prefix(a, b) == expected == common_prefix(b, a)


def test_cost_model_remembers_costs_until_the_next_observation():
    model, fresh = CostModel(), CostModel()
    for k, seconds in [(0, 1.0), (3, 1.5), (0, 1.2), (6, 2.0)]:
        assert [model.cost(j) for j in range(8)] == [fresh.cost(j) for j in range(8)]
        model.observe(k, seconds)
        fresh.observe(k, seconds)
        fresh._costs.clear()
    model.prior_step = fresh.prior_step = 0.9  # settings changed in place
    assert [model.cost(j) for j in range(8)] == [
        CostModel(prior_step=0.9, _seconds=dict(fresh._seconds)).cost(j) for j in range(8)
    ]


def test_reduced_subset_covers_the_drafted_tokens():
    """Sanity: the greedy reduced-vocabulary tokens are target ids of the drafter's subset."""
    level = NeuralLevel(make_drafter(seed=7), tm.VOCAB, LogitsProcessorList(), LevelStats("d"))
    tokens, probs, _ = level.generate(torch.tensor([1, 4, 6]), 5, False, set())
    assert set(tokens.tolist()) <= set(EVEN.tolist()) and bool(((probs > 0) & (probs <= 1)).all())
