"""Token Recycling (hf_cascade.recycling): the recycled table and its best-first expansion on
hand-made inputs; the table filled from a real verification's rows; hot start and its reset. Parity, exact
sampling and no state leak: the contract (tests/test_contract.py, entry "recycling")."""

from __future__ import annotations

import pytest
import torch

from hf_cascade import Policy, RecyclingSettings
from hf_cascade.core import TokenTree
from hf_cascade.core.rows import TreeRows
from hf_cascade.recycling import RecycledCandidates, RecyclingAssistant, RecyclingShape
from tests import tiny_models as tm
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)


def table(entries: dict) -> RecycledCandidates:
    c = RecycledCandidates(top_k=3)
    c.table = {t: (list(k), list(p)) for t, (k, p) in entries.items()}
    return c


def test_expand_is_best_first_by_path_probability():
    c = table({1: ([2, 3], [0.6, 0.3]), 2: ([4, 5], [0.9, 0.1]), 3: ([6], [0.5]), 4: ([7], [0.2])})
    got = c.expand(1, RecyclingShape(max_nodes=5, max_depth=8), depth=8)
    # path probabilities: 2 .6, 4 .54, 3 .3, 6 .15, 7 .108, 5 .06
    assert got.tokens == [2, 4, 3, 6, 7]
    assert got.parents == [-1, 0, -1, 2, 1]
    assert got.probs == got.estimates == [0.6, 0.9, 0.3, 0.5, 0.2]
    assert not any(got.on_seed)
    got = c.expand(1, RecyclingShape(max_nodes=10, max_depth=1), depth=1)
    assert (got.tokens, got.parents) == ([2, 3], [-1, -1])             # depth 1: the root's children only
    assert c.expand(9, RecyclingShape(), depth=8).tokens == []         # nothing recycled after 9
    # an estimate of the recycled probabilities reorders: 3 (.3 -> .9) before 2 (.6 -> .2)
    got = c.expand(1, RecyclingShape(max_nodes=2, max_depth=1), depth=1, estimate=lambda p: 0.9 if p < 0.5 else 0.2)
    assert got.tokens == [3, 2] and got.probs == [0.3, 0.6] and got.estimates == [0.9, 0.2]


def test_expand_merges_a_seed_path():
    c = table({1: ([2, 3], [0.6, 0.3]), 2: ([4], [0.9])})
    # the seed 3 -> 8: 3 is estimated max(.3, .7) = .7 and 8 (unknown after 3) .7: path .49
    got = c.expand(1, RecyclingShape(max_nodes=10, max_depth=8), depth=8, seed=[3, 8], seed_estimate=0.7)
    assert got.tokens == [3, 2, 4, 8] and got.parents == [-1, -1, 1, 0]
    assert got.estimates == [0.7, 0.6, 0.9, 0.7]
    assert got.probs == [0.3, 0.6, 0.9, 0.0]                           # 8 is not in the table after 3
    assert got.on_seed == [True, False, False, True]
    assert got.tokens.count(3) == 1                                    # the table's 3 and the seed's 3: one node


def test_record_keeps_the_computed_rows_top_k():
    V = 6
    tree = TokenTree(torch.tensor([4, 5]), torch.tensor([-1, 0]))
    raw = torch.tensor([[0.0, 3.0, 2.0, 1.0, -9.0, -9.0],     # row 0 (after the root 7): 1 > 2 > 3
                        [5.0, 0.0, 0.0, 0.0, 0.0, 4.0],       # row 1 (after 4): 0 > 5
                        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])      # row 2 (after 5): not computed
    hidden = torch.eye(3)
    rows = TreeRows(tree, torch.tensor([1, 7]), [], hidden=hidden, head=lambda h: h @ raw, block_rows=2)
    rows.raw(0)                                               # computes rows 0 and 1 (its first-child chain)
    c = RecycledCandidates(top_k=2)
    c.record(rows, [7, 4, 5])
    assert set(c.table) == {7, 4}                              # row 2 was never computed: nothing about 5
    assert c.table[7][0] == [1, 2] and c.table[4][0] == [0, 5]
    p = torch.softmax(raw[0], -1)
    assert c.table[7][1] == pytest.approx([float(p[1]), float(p[2])])
    assert rows.rows_computed == 2                            # recording computed no row


def test_shape_and_settings_are_checked():
    with pytest.raises(ValueError):
        RecyclingShape(top_k=0)
    with pytest.raises(TypeError, match="VerifyCost"):
        RecyclingAssistant(policy=Policy(verify_cost=3))


def test_hot_start_keeps_the_table_per_target():
    target = tm.llama(vocab_size=16, layers=1, hidden=16, seed=3)
    prompt = torch.tensor([[1, 5, 6, 5, 6, 5]])
    cold, hot = RecyclingAssistant(), RecyclingAssistant(settings=RecyclingSettings(hot_start=True))
    for a in (cold, hot):
        target.generate(prompt, do_sample=False, max_new_tokens=12, assistant_model=a)
    cold_table, hot_table = cold.candidates, hot.candidates
    assert len(hot_table) > 0
    for a in (cold, hot):
        target.generate(prompt, do_sample=False, max_new_tokens=12, assistant_model=a)
    assert cold.candidates is not cold_table                   # one table per call
    assert hot.candidates is hot_table                         # kept, and grown by the second call
    other = tm.llama(vocab_size=16, layers=1, hidden=16, seed=4)
    other.generate(prompt, do_sample=False, max_new_tokens=4, assistant_model=hot)
    assert hot.candidates is not hot_table                     # another target: a new table
    hot.reset()
    assert len(hot.candidates) == 0
