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
    assert (got.tokens, got.parents) == ([2, 3], [-1, -1])  # depth 1: the root's children only
    assert c.expand(9, RecyclingShape(), depth=8).tokens == []  # nothing recycled after 9
    # an estimate of the recycled probabilities reorders: 3 (.3 -> .9) before 2 (.6 -> .2)
    got = c.expand(1, RecyclingShape(max_nodes=2, max_depth=1), depth=1, estimate=lambda p: 0.9 if p < 0.5 else 0.2)
    assert got.tokens == [3, 2] and got.probs == [0.3, 0.6] and got.estimates == [0.9, 0.2]


def test_expand_merges_a_seed_path():
    c = table({1: ([2, 3], [0.6, 0.3]), 2: ([4], [0.9])})
    # the seed 3 -> 8: 3 is estimated max(.3, .7) = .7 and 8 (unknown after 3) .7: path .49
    got = c.expand(1, RecyclingShape(max_nodes=10, max_depth=8), depth=8, seed=[3, 8], seed_estimate=0.7)
    assert got.tokens == [3, 2, 4, 8] and got.parents == [-1, -1, 1, 0]
    assert got.estimates == [0.7, 0.6, 0.9, 0.7]
    assert got.probs == [0.3, 0.6, 0.9, 0.0]  # 8 is not in the table after 3
    assert got.on_seed == [True, False, False, True]
    assert got.tokens.count(3) == 1  # the table's 3 and the seed's 3: one node


def _expand_every_child(table, root, shape, depth, seed, seed_estimate, estimate):
    """The expansion by its definition: every child of an expanded node enters one heap (ties by push order); a
    seed path's token ``i`` is a child of the seed token ``i - 1`` (share 1)."""
    import heapq

    heap, out, count = [], ([], [], [], []), 0

    def push(parent, token, path, level, at):
        nonlocal count
        if level >= depth:
            return
        kids, probs = table.get(token, ((), ()))
        seeds = [seed[at + 1]] if at is not None and at + 1 < len(seed) else []
        for child, p in zip(kids, probs):
            if child not in seeds:
                count += 1
                heapq.heappush(heap, (-path * estimate(p), count, parent, child, level, p, estimate(p), None))
        for child in seeds:
            p = dict(zip(kids, probs)).get(child, 0.0)
            count += 1
            e = max(seed_estimate, estimate(p))
            heapq.heappush(heap, (-path * e, count, parent, child, level, p, e, at + 1))

    push(-1, root, 1.0, 0, -1)
    while heap and len(out[0]) < shape.max_nodes:
        neg, _, parent, token, level, p, e, at = heapq.heappop(heap)
        for values, v in zip(out, (token, parent, p, e)):
            values.append(v)
        push(len(out[0]) - 1, token, -neg, level + 1, at)
    return out


def test_expand_equals_the_expansion_with_every_child_queued():
    """The heap holds one child per expanded node (its siblings wait in order): the same nodes in the same order as
    queueing every child, seeds and ties included."""
    import random

    rng = random.Random(0)
    for _ in range(400):
        vocab, k = rng.choice([5, 12, 40]), rng.choice([2, 4, 8])
        cands = RecycledCandidates(k)
        for t in range(vocab):
            if rng.random() < 0.8:
                ids = rng.sample(range(vocab), min(k, vocab))
                cands.table[t] = (ids, sorted((rng.choice([0.5, 0.25, 0.1, rng.random()]) for _ in ids), reverse=True))
        shape = RecyclingShape(k, rng.choice([4, 16, 32]), rng.choice([2, 4, 8]))
        seed = [rng.randrange(vocab) for _ in range(rng.randint(0, 5))]
        estimate = rng.choice([lambda p: p, lambda p: min(1.0, 1.3 * p), lambda p: 0.3 if p < 0.2 else p])
        root = rng.randrange(vocab)
        got = cands.expand(root, shape, shape.max_depth, seed, 0.5, estimate)
        want = _expand_every_child(cands.table, root, shape, shape.max_depth, seed, 0.5, estimate)
        assert (got.tokens, got.parents, got.probs, got.estimates) == want


def test_record_keeps_the_computed_rows_top_k():
    tree = TokenTree(torch.tensor([4, 5]), torch.tensor([-1, 0]))
    raw = torch.tensor(
        [
            [0.0, 3.0, 2.0, 1.0, -9.0, -9.0],  # row 0 (after the root 7): 1 > 2 > 3
            [5.0, 0.0, 0.0, 0.0, 0.0, 4.0],  # row 1 (after 4): 0 > 5
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        ]
    )  # row 2 (after 5): not computed
    hidden = torch.eye(3)
    rows = TreeRows(tree, torch.tensor([1, 7]), [], hidden=hidden, head=lambda h: h @ raw, block_rows=2)
    rows.raw(0)  # computes rows 0 and 1 (its first-child chain)
    c = RecycledCandidates(top_k=2)
    c.record(rows, [7, 4, 5])
    assert set(c.table) == {7, 4}  # row 2 was never computed: nothing about 5
    assert c.table[7][0] == [1, 2] and c.table[4][0] == [0, 5]
    p = torch.softmax(raw[0], -1)
    assert c.table[7][1] == pytest.approx([float(p[1]), float(p[2])])
    assert rows.rows_computed == 2  # recording computed no row


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
    assert cold.candidates is not cold_table  # one table per call
    assert hot.candidates is hot_table  # kept, and grown by the second call
    other = tm.llama(vocab_size=16, layers=1, hidden=16, seed=4)
    other.generate(prompt, do_sample=False, max_new_tokens=4, assistant_model=hot)
    assert hot.candidates is not hot_table  # another target: a new table
    hot.reset()
    assert len(hot.candidates) == 0
