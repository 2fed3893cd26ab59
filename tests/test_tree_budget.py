"""Hardware-aware tree size (hf_cascade.core.payoff): the cost profile, path probabilities, the size choice and
the ancestor-closed node set on hand-made inputs; the measured profile on a tiny model."""

from __future__ import annotations

import pytest
import torch

from hf_cascade.core import TokenTree
from hf_cascade.core.payoff import VerifyCost, best_size, keep_best, path_probabilities
from hf_cascade.measure import measure_verify_cost
from tests import tiny_models as tm
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

T = torch.tensor


def test_verify_cost_table_and_extrapolation():
    c = VerifyCost((1.0, 1.6, 1.8, 1.9))
    assert [round(c(n), 6) for n in range(7)] == [1.0, 1.6, 1.8, 1.9, 2.05, 2.2, 2.35]  # slope of 1.6 -> 1.9: 0.15
    assert VerifyCost((1.0, 1.2, 1.2))(4) == pytest.approx(1.2)  # a flat half stays flat
    assert c.scaled(0.5).relative == pytest.approx((1.0, 1.3, 1.4, 1.45))
    assert VerifyCost.flat()(50) == 1.0
    default = VerifyCost.reference()
    assert default(0) == 1.0 <= default(1) < default(2) < default(16) < default(32)
    for bad in ((1.0,), (0.5, 1.0), (1.0, 1.5, 1.4)):
        with pytest.raises(ValueError):
            VerifyCost(bad)


def test_path_probabilities_golden():
    # root -> a (.8) -> b (.5) -> c (.9);  root -> d (.1);  a -> e (.3)
    got = path_probabilities([-1, 0, 1, -1, 0], [0.8, 0.5, 0.9, 0.1, 0.3])
    assert got == pytest.approx([0.8, 0.4, 0.36, 0.1, 0.24])
    assert path_probabilities([], []) == []


def test_best_size_golden():
    cost = VerifyCost((1.0, 1.6, 1.7, 1.8, 1.9))
    # value(m) = 1 + G(m) - R * cost(m); R = 1:
    #   m=0: 0   m=1: .9-.6=.3   m=2: 1.5-.7=.8   m=3: 1.8-.8=1.0   m=4: 1.85-.9=.95
    assert best_size([0.9, 0.6, 0.3, 0.05], cost, 1.0) == 3
    # a faster generation (R = 2) asks more of each node: m=0: -1, m=1: -1.3, m=2: -.9, m=3: -.8, m=4: -.95
    assert best_size([0.9, 0.6, 0.3, 0.05], cost, 2.0) == 3
    assert best_size([0.4, 0.1], cost, 1.0) == 0  # .4 - .6 < 0: a plain step
    assert best_size([0.5, 0.1], cost, 1.0) == 0  # m=2: .6-.7 < 0 too
    assert best_size([0.9, 0.6, 0.3, 0.05], VerifyCost.flat(), 1.0) == 4  # free nodes: verify all
    assert best_size([], cost, 1.0) == 0


def test_keep_best_keeps_the_most_probable_closed_subtree():
    tree = TokenTree(T([10, 11, 12, 13, 14]), T([-1, 0, 1, -1, 0]))
    paths = [0.8, 0.4, 0.36, 0.1, 0.4]  # tie of b and e: node order decides
    cost = VerifyCost((1.0, 1.5, 1.6, 1.7, 2.5, 2.6))
    keep = keep_best(paths, cost, 1.0)  # m=3 (value 1.6 - .7) beats m=2 (.6)
    assert keep == [True, True, False, False, True]
    sub = tree.select(T(keep))
    assert sub.tokens.tolist() == [10, 11, 14] and sub.parents.tolist() == [-1, 0, 0]
    assert keep_best(paths, cost, 5.0) == [False] * 5  # nothing pays at R = 5


def test_measure_verify_cost_on_a_tiny_model():
    model = tm.gemma3_target()
    cost = measure_verify_cost(model, max_nodes=4, prompt_len=12, steps=4, repeats=1)
    assert len(cost.relative) == 5 and cost.relative[0] == 1.0
    assert all(b >= a for a, b in zip(cost.relative, cost.relative[1:]))


def test_monotone_profile_pools_a_spike_instead_of_carrying_it():
    from hf_cascade.measure import monotone_profile

    # a spike at 2 nodes (1.6): a running maximum made 2..16 all cost 1.6, so a tree of 16 looked as cheap as one of 2
    rel = monotone_profile({0: 1.0, 1: 1.1, 2: 1.6, 4: 1.2, 8: 1.4, 16: 1.8})
    assert len(rel) == 17 and rel[0] == 1.0
    assert rel[1] == pytest.approx(1.1)
    assert (
        rel[2] == pytest.approx(1.4) and rel[4] == pytest.approx(1.4) and rel[8] == pytest.approx(1.4)
    )  # 1.6, 1.2, 1.4 pooled
    assert rel[3] == pytest.approx(1.4)
    assert rel[12] == pytest.approx(1.6) and rel[16] == pytest.approx(1.8)  # linear between 8 and 16
    assert all(b >= a for a, b in zip(rel, rel[1:]))
    # already non-decreasing: unchanged at the measured sizes; below 1: raised to 1
    assert monotone_profile({0: 1.0, 1: 1.0, 2: 1.2, 4: 1.5}) == pytest.approx((1.0, 1.0, 1.2, 1.35, 1.5))
    assert monotone_profile({0: 1.0, 1: 0.9, 2: 0.95}) == (1.0, 1.0, 1.0)
