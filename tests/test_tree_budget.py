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
    assert [round(c(n), 6) for n in range(7)] == [1.0, 1.6, 1.8, 1.9, 2.05, 2.2, 2.35]   # slope of 1.6 -> 1.9: 0.15
    assert VerifyCost((1.0, 1.2, 1.2))(4) == pytest.approx(1.2)                          # a flat half stays flat
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
    assert best_size([0.4, 0.1], cost, 1.0) == 0                       # .4 - .6 < 0: a plain step
    assert best_size([0.5, 0.1], cost, 1.0) == 0                       # m=2: .6-.7 < 0 too
    assert best_size([0.9, 0.6, 0.3, 0.05], VerifyCost.flat(), 1.0) == 4   # free nodes: verify all
    assert best_size([], cost, 1.0) == 0


def test_keep_best_keeps_the_most_probable_closed_subtree():
    tree = TokenTree(T([10, 11, 12, 13, 14]), T([-1, 0, 1, -1, 0]))
    paths = [0.8, 0.4, 0.36, 0.1, 0.4]                                  # tie of b and e: node order decides
    cost = VerifyCost((1.0, 1.5, 1.6, 1.7, 2.5, 2.6))
    keep = keep_best(paths, cost, 1.0)                                  # m=3 (value 1.6 - .7) beats m=2 (.6)
    assert keep == [True, True, False, False, True]
    sub = tree.select(T(keep))
    assert sub.tokens.tolist() == [10, 11, 14] and sub.parents.tolist() == [-1, 0, 0]
    assert keep_best(paths, cost, 5.0) == [False] * 5                   # nothing pays at R = 5


def test_measure_verify_cost_on_a_tiny_model():
    model = tm.gemma3_target()
    cost = measure_verify_cost(model, max_nodes=4, prompt_len=12, steps=4, repeats=1)
    assert len(cost.relative) == 5 and cost.relative[0] == 1.0
    assert all(b >= a for a, b in zip(cost.relative, cost.relative[1:]))
