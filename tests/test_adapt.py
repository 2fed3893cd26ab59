"""Golden tests of :class:`hf_cascade.core.payoff.AdaptiveBudget`, the default draft policy of GLIDE and ReDrafter:
whether to draft, how deep, which nodes, from measured costs and calibrated acceptance (issue 28)."""

from __future__ import annotations

import pytest
import torch

from hf_cascade.core.payoff import AdaptiveBudget, VerifyCost
from hf_cascade.core.structure import TokenTree

pytestmark = pytest.mark.measured_costs  # the rules themselves (tests/conftest.py: pinned_costs)

FLAT = VerifyCost((1.0, 1.0, 1.0, 1.0, 1.0))
STEEP = VerifyCost((1.0, 3.0, 3.5, 4.0))


def chain(n: int) -> TokenTree:
    return TokenTree(torch.arange(10, 10 + n), torch.arange(-1, n - 1))


def test_a_profile_is_a_measured_table():
    """The budget is given a profile (the assistant measures it when it binds): there is no unmeasured one."""
    with pytest.raises(TypeError):
        VerifyCost()


def test_should_draft_pays_for_the_first_row_and_explores():
    assert AdaptiveBudget(FLAT).should_draft()  # free rows, free drafts: always
    b = AdaptiveBudget(STEEP, explore_every=4)  # a_1 = 0.5 < R * (0 + 3 - 1) = 2
    assert [b.should_draft() for _ in range(8)] == [False, False, False, True] * 2


def test_draft_cost_and_rate_in_units():
    b = AdaptiveBudget(FLAT)
    assert b.draft_cost() == 0.0 and b.rate == 1.0
    b.unit_seconds, b.forward_seconds = 0.1, 0.02  # a draft forward: a fifth of a plain step
    assert b.draft_cost() == pytest.approx(0.2)
    b.observe_step(chain(3), [0.9, 0.9, 0.9], [0, 1], emitted=3, verify_seconds=None)
    assert (b.tokens, b.units) == (4.0, 2.0) and b.rate == 2.0
    assert b.keep_drafting(0.41) and not b.keep_drafting(0.39)  # reach >= R * c_draft = 0.4


def test_observe_step_calibrates_reached_nodes_only():
    b = AdaptiveBudget(FLAT)
    tree = TokenTree(torch.tensor([5, 6, 7, 8]), torch.tensor([-1, 0, 1, -1]))  # 0 -> 1 -> 2, and sibling 3
    b.observe_step(tree, [0.9, 0.8, 0.7, 0.1], path=[0], emitted=2, verify_seconds=0.2)
    # reached: 0 (accepted), 3 (root child, rejected), 1 (child of accepted 0, rejected); 2 was never reached
    assert sum(b.calibration._expected) == pytest.approx(0.9 + 0.1 + 0.8)
    assert sum(b.calibration._hits) == 1.0
    assert b.unit_seconds == pytest.approx(0.2) and b.first_acceptance() == pytest.approx(2 / 3)


def test_select_uses_calibrated_probabilities():
    b = AdaptiveBudget(VerifyCost((1.0, 1.0, 1.3, 1.6)))
    tree = chain(3)
    kept, probs = b.select(tree, [0.95, 0.9, 0.8])
    assert kept.num_nodes == 3 and probs == [0.95, 0.9, 0.8]  # 0.95 + 0.855 + 0.684 pay 0.3 each at R = 1
    for _ in range(200):  # the target never agrees with this drafter
        b.calibration.observe(0.9, False)
        b.calibration.observe(0.85, False)
    kept, probs = b.select(tree, torch.tensor([0.95, 0.9, 0.8]))
    assert kept.num_nodes == 1 and probs == pytest.approx([0.95])  # only the free first row is left


def test_draft_gate_drafts_first_measures_plain_then_follows_the_faster_and_explores():
    """:class:`~hf_cascade.core.payoff.DraftGate`: drafts, takes one plain step, then follows the side that
    advances the lagging rows faster (their tokens per second, an average that forgets), drafting every
    ``explore_every``-th refused step, half as often and half as wide after each exploring step that did not
    pay; a drafted step faster than the plain rate doubles the width again."""
    from hf_cascade.core.payoff import DraftGate

    gate = DraftGate(explore_every=3, decay=0.5)
    assert gate.allows()  # nothing measured: draft
    gate.observe(True, tokens=2, seconds=1.0)  # drafted: the lagging rows got 2 tokens in 1 s
    assert not gate.allows()  # measure a plain step once
    gate.observe(False, tokens=1, seconds=0.5)  # plain: 2 tokens / s: a tie drafts
    assert gate.allows() and gate.rate == {True: 2.0, False: 2.0}
    gate.observe(True, tokens=1, seconds=1.0, widest=10)  # drafted slower: 0.5 * 2 + 0.5 * 1 = 1.5
    assert gate.rate[True] == pytest.approx(1.5) and gate.width is None
    assert [gate.allows() for _ in range(3)] == [False, False, True]
    assert gate.width == 5  # drafting stopped paying: at most half as wide
    gate.observe(True, tokens=1, seconds=1.0, widest=5)  # explored, still slower (1.25): explore half as often,
    assert [gate.allows() for _ in range(6)] == [False] * 5 + [True]
    assert gate.width == 2  # and verify at most half as many nodes per row
    gate.observe(True, tokens=1, seconds=4.0, widest=2)  # slower again, 8 plain steps' time: 12 steps between, 1 node
    assert gate.width == 1 and gate.interval == 12
    assert [gate.allows() for _ in range(12)] == [False] * 11 + [True]
    gate.observe(True, tokens=5, seconds=1.0, widest=1)  # an exploring step that paid: 0.5 * 0.75 + 0.5 * 5,
    assert gate.rate[True] == pytest.approx(2.875) and gate.allows() and gate.interval == 3
    assert gate.width == 2  # faster than plain (5 > 2 tokens / s): wider again
    gate.observe(True, tokens=3, seconds=0.0)  # no time measured: ignored
    assert gate.rate[True] == pytest.approx(2.875) and gate.width == 2


def test_draft_gate_width_by_expected_gain():
    """Golden: :meth:`DraftGate.width_for` picks the width with the most expected tokens of the slowest lagging
    row per second of step, ``(1 + sum_k prod_b P_b(>= k)) / t(k)``, and 0 where a plain step is faster. Prior
    costs (nothing measured): ``t(k) / t(0) = 1.6 + 0.05 k``."""
    from hf_cascade.core.payoff import DraftGate

    gate = DraftGate()
    # one row, reach 0.9, 0.81, 0.729, 0.6561: E(k) = 1.9, 2.71, 3.439, 4.0951 over 1.65, 1.70, 1.75, 1.80
    assert gate.width_for([[0.9, 0.81, 0.729, 0.6561]], rows=4) == 4
    assert gate.width_for([[0.5, 0.25]], rows=4) == 2  # 1.5 / 1.65 < 1 < 1.75 / 1.7
    assert gate.width_for([[0.4, 0.16]], rows=4) == 0  # 1.4 / 1.65, 1.56 / 1.7: a plain step is faster
    # two tied rows: the joint reach multiplies (0.9 * 0.5 = 0.45 ...): E = 1.45 / 1.65 < 1, 1.5 ...: no draft
    assert gate.width_for([[0.9, 0.81, 0.729], [0.5, 0.25, 0.125]], rows=4) == 0
    assert gate.width_for([[0.9, 0.81], []], rows=4) == 0  # a lagging row without a draft: nothing gained
    assert gate.width_for([], rows=4) == 0
    # measured: plain steps 0.1 s, 1-node steps 0.11 s (cost 1.1); 2 nodes interpolated from 1 by the prior's shape
    for _ in range(3):
        gate.observe(False, 1, 0.1, 0, rows=2)
        gate.observe(True, 1, 0.11, 1, rows=2)
    assert gate.costs[2].cost(1) == pytest.approx(1.1)
    assert gate.width_for([[0.5, 0.02]], rows=2) == 1  # 1.5 / 1.1 > 1.52 / (1.1 * 1.7 / 1.65)
    assert gate.width_for([[0.5, 0.25]], rows=2) == 2  # 1.75 / 1.133
    assert gate.costs[4].cost(1) == pytest.approx(1.65)  # each row count measures its own


def test_the_batch_gate_follows_the_lagging_rows(monkeypatch):
    """The batch loop gives the gate the fewest tokens emitted by the rows with the most tokens left (the
    rows the batch waits for), not the batch's total."""
    from hf_cascade import CascadeAssistant, MaxGram
    from hf_cascade.core.payoff import DraftGate
    from tests import tiny_models as tm

    seen = []
    original = DraftGate.observe
    monkeypatch.setattr(
        DraftGate, "observe", lambda self, d, t, s, w=0, rows=None: seen.append(t) or original(self, d, t, s, w, rows)
    )
    target = tm.llama_target()
    ids = torch.tensor([[1, 5, 6, 7, 5, 6, 7, 5, 6], [0, 0, 0, 0, 0, 1, 40, 41, 42]])
    mask = (torch.arange(9) >= torch.tensor([[0], [5]])).long()
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12)
    a = CascadeAssistant([MaxGram()])
    out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12, assistant_model=a)
    assert out.tolist() == plain.tolist()
    rows = a.last_stats.rows
    assert len(seen) == a.last_stats.target_calls and all(t >= 1 for t in seen)
    assert sum(seen) <= max(r.new_tokens for r in rows) < sum(r.new_tokens for r in rows)


def test_the_profile_is_rescaled_to_the_calls_own_steps():
    """Golden: plain steps take 0.1 s; a 4-node step the profile puts at 1.2 takes 0.16 s (excess 0.6 against the
    profile's 0.2: ratio 3): the increments scale toward 3 by the EMA (decay 0.8); without plain steps they stand."""
    profile = VerifyCost((1.0, 1.05, 1.1, 1.15, 1.2))
    four = TokenTree(torch.tensor([1, 2, 3, 4]), torch.tensor([-1, 0, 1, 2]))
    empty = TokenTree(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long))
    b = AdaptiveBudget(profile)
    b.observe_step(four, [0.5] * 4, [], 1, 0.16)  # no plain step yet: nothing to compare with
    assert b.scale == 1.0 and b.cost is profile
    b.observe_step(empty, [], [], 1, 0.1)
    b.observe_step(four, [0.5] * 4, [], 1, 0.16)
    assert b.scale == pytest.approx(0.8 * 1.0 + 0.2 * 3.0)
    assert b.cost(4) == pytest.approx(1.0 + b.scale * 0.2) and b.cost(0) == 1.0
    assert b.profile is profile
    flat = AdaptiveBudget(VerifyCost.flat())  # a flat profile (no excess) is never rescaled
    flat.observe_step(empty, [], [], 1, 0.1)
    flat.observe_step(four, [0.5] * 4, [], 1, 0.5)
    assert flat.scale == 1.0


def test_a_batch_step_is_charged_as_its_widest_draft():
    """Golden: in a batch (``verify_nodes``, the widest row's draft) a row that drafted nothing in a step where
    another row drafted 4 nodes is charged, timed and rescaled as a 4-node step, not taken for a plain one; a
    step where no row drafted is its plain step."""
    profile = VerifyCost((1.0, 1.05, 1.1, 1.15, 1.2))
    empty = TokenTree(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long))
    b = AdaptiveBudget(profile)
    b.observe_step(empty, [], [], 1, 0.16, verify_nodes=4)  # another row's 4 nodes set the step's width
    assert b._plain_seconds is None and b.units == pytest.approx(1.0 + 1.2)
    assert b.unit_seconds == pytest.approx(0.16 / 1.2)
    b.observe_step(empty, [], [], 1, 0.1, verify_nodes=0)  # nobody drafted: a plain step
    assert b._plain_seconds == pytest.approx(0.1)
    b.observe_step(empty, [], [], 1, 0.16, verify_nodes=4)
    assert b.scale == pytest.approx(0.8 * 1.0 + 0.2 * 3.0)  # as the row's own 4-node step would
    one = AdaptiveBudget(profile)  # at batch 1 (None): the row's own draft
    one.observe_step(empty, [], [], 1, 0.16)
    assert one._plain_seconds == pytest.approx(0.16)


def test_a_chain_row_learns_verification_cost_only_from_steps_its_own_draft_set():
    """The linear strategies' cost models (``on_target_review``'s seconds) in a batch: a step's time is given to a
    row only when its own draft was the widest (at batch 1, ``verify_nodes`` is ``None``: always)."""
    from types import SimpleNamespace

    from hf_cascade.candidate import ChainDrafter
    from hf_cascade.core.accept import TreeAcceptance

    seen = []
    gen = SimpleNamespace(on_target_review=lambda seq, proposed, accepted, seconds: seen.append((proposed, seconds)))
    drafter = ChainDrafter(gen)
    two = chain(2)
    for nodes in (None, 2, 5):
        state = SimpleNamespace(seq=torch.arange(4), verify_seconds=0.3, verify_nodes=nodes)
        drafter.on_accept(two, TreeAcceptance(path=torch.tensor([0]), bonus=7), state)
    assert seen == [(2, 0.3), (2, 0.3), (2, None)]
