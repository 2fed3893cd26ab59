"""HSDDW's payoff rule (``Policy.cost_aware``, the default; not in the paper): the draft
models draft a step only while their accepted tokens are worth their forwards and the rows their window adds
to the target's step (:class:`~hf_cascade.core.payoff.DrafterPayoff` at reach 1). The rule itself:
``tests/test_lookahead.py``; the paper's windows with the rule held open: ``tests/test_hsddw.py``."""

from __future__ import annotations

import time

import pytest
from transformers import GenerationConfig

from hf_cascade import DynamicWindowAssistant, DynamicWindowSettings, Policy
from tests.test_greedy_parity import ONE_TOKEN, assert_parity, m  # noqa: F401  (m: fixture)
from tests.test_hsddw import NO_EOS
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)


def test_hsddw_payoff_charges_the_rows_its_window_adds(m):
    """A drafted step's surcharge is the share of the step its rows took by the call's measured step times
    (``1 - t(0) / t(k)``); rows count as free until a plain step has been measured."""
    a = DynamicWindowAssistant(m["noisy"], policy=Policy(lookup=False))
    gen = a.build(m["target"], GenerationConfig(max_length=64, **NO_EOS), None, a.new_stats())
    seen, observe = [], gen.policy.payoff.observe_consult

    def spy(reach, seconds, surcharge=0.0):
        seen.append((reach, seconds, surcharge))
        observe(reach, seconds, surcharge)

    gen.policy.payoff.observe_consult = spy
    gen.policy.observe_window(3, 1, 0.050, 0.004)  # 3 drafted rows (4 ms of forwards), no plain step measured yet
    gen.policy.observe_window(0, 0, 0.040, None)  # a plain step (nothing consulted): 40 ms
    gen.policy.observe_window(3, 2, 0.050, 0.005)  # 3 rows again: t(3) is now 0.8 * 50 + 0.2 * 50 ms
    assert seen == [(1.0, 0.004, 0.0), (1.0, 0.005, pytest.approx(0.010))]
    assert gen.policy.payoff._accepted == 3  # the draft models' accepted tokens only
    rate = (2 + 1 + 3) / (0.004 + 0.005 + 0.050 + 0.040 + 0.050)  # no surcharge
    assert gen.policy.payoff.rate() == pytest.approx(rate)
    assert gen.policy.payoff._consult_seconds == pytest.approx(0.8 * 0.004 + 0.2 * 0.015)


@pytest.mark.measured_costs
def test_hsddw_stops_drafting_where_the_draft_model_does_not_pay(m, monkeypatch):
    """A draft model whose forwards cost far more than the target's steps (30 ms each beside a tiny target's
    millisecond) drafts only to keep learning (every 8th refused step); the output is plain greedy's. With
    ``cost_aware=False`` it drafts every step, as in the paper."""
    drafter = m["noisy"]
    paper = DynamicWindowAssistant(
        drafter, settings=DynamicWindowSettings(max_window=2, tau_init=2.0), policy=Policy.paper()
    )
    stats = assert_parity(m["target"], ONE_TOKEN, paper, max_new_tokens=30, **NO_EOS)
    assert len(stats.draft_windows) >= stats.target_calls - 1 and stats.plain_steps == 0  # the last may have no room

    forward = drafter.forward

    def slow_forward(*args, **kwargs):
        time.sleep(0.03)
        return forward(*args, **kwargs)

    monkeypatch.setattr(drafter, "forward", slow_forward)
    a = DynamicWindowAssistant(
        drafter, settings=DynamicWindowSettings(max_window=2, tau_init=2.0), policy=Policy(lookup=False)
    )
    assert a.cost_aware and "cost_aware=True" in repr(a)
    stats = assert_parity(m["target"], ONE_TOKEN, a, max_new_tokens=30, **NO_EOS)
    consulted = len(stats.draft_windows)
    assert stats.target_calls - 1 <= consulted + stats.plain_steps <= stats.target_calls
    assert consulted <= 3 + stats.target_calls // 8, (consulted, stats.target_calls)
    assert stats.to_dict()["plain_steps"] == stats.plain_steps > 0
