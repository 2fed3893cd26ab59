"""Max-Gram's adaptive lookahead: the cost model, the per-bucket acceptance estimate and the
expected-tokens-per-cost rule (golden numbers from the prior cost curve)."""

import math

import pytest
import torch

from hf_cascade.core.payoff import AcceptanceCalibration, AdaptiveLookahead, CostModel, ExpectedGainRule

# -- AdaptiveLookahead / CostModel -----------------------------------------------------------------------


def _fixed():
    return CostModel(measure=False)


def test_cost_model_prior_and_measurements():
    c = _fixed()
    assert c.cost(0) == 1.0
    assert math.isclose(c.cost(4), 1.0 + 0.6 + 0.2)
    c.observe(4, 123.0)  # measure=False: ignored
    assert math.isclose(c.cost(4), 1.8)
    m = CostModel()
    m.observe(0, 1.0)
    m.observe(4, 2.0)
    assert math.isclose(m.cost(4), 2.0)
    assert math.isclose(m.cost(2), 2.0 * 1.7 / 1.8)  # interpolated from k = 4 with the prior's shape
    m.observe(4, 4.0)  # EMA: 0.8 * 2 + 0.2 * 4
    assert math.isclose(m.cost(4), 2.4)


def test_lookahead_high_acceptance_drafts_everything():
    la = AdaptiveLookahead(max_tokens=10, cost=_fixed(), bucket_priors={5: 0.95})
    assert la.choose(5, available=12) == 10
    assert la.choose(5, available=4) == 4
    assert la.choose(5, available=12, limit=3) == 3
    for _ in range(20):
        la.observe(1, proposed=10, accepted=10)
    assert la.acceptance(1) > 0.9
    assert la.choose(1, available=10) == 10


def test_lookahead_low_acceptance_drafts_nothing_but_explores():
    la = AdaptiveLookahead(max_tokens=10, cost=_fixed(), explore_every=4, explore_tokens=2)
    for _ in range(30):
        la.observe(0, proposed=5, accepted=0)
    assert la.acceptance(0) < 0.15
    choices = [la.choose(0, available=10) for _ in range(12)]
    assert choices == [0, 0, 0, 2] * 3
    # exploration never exceeds what is available
    la2 = AdaptiveLookahead(max_tokens=10, cost=_fixed(), explore_every=1, explore_tokens=5, prior_accept=0.001)
    assert la2.choose(0, available=3) == 3


def test_lookahead_non_adaptive_and_limits():
    la = AdaptiveLookahead(max_tokens=6, cost=_fixed(), adaptive=False, prior_accept=0.001)
    assert la.choose(0, available=10) == 6
    assert la.choose(0, available=10, limit=2) == 2
    assert la.choose(0, available=0) == 0


def test_lookahead_observe_updates_beta_estimate():
    la = AdaptiveLookahead(prior_accept=0.5, prior_strength=4.0, cost=_fixed())
    la.observe(3, proposed=5, accepted=2)  # 2 accepted, 1 rejected trial
    assert math.isclose(la.acceptance(3), (2 + 2) / (3 + 4))
    la.observe(3, proposed=3, accepted=3)  # all accepted: 3 trials
    assert math.isclose(la.acceptance(3), (5 + 2) / (6 + 4))
    la.observe(3, proposed=0, accepted=0)  # ignored
    assert math.isclose(la.acceptance(3), 7 / 10)


def test_lookahead_middle_acceptance_picks_interior_length():
    # a = 0.5, cost(k) = 1.6 + 0.05 k: E(k)/cost(k) = (2 - 0.5^k) / (1.6 + 0.05 k), best at k = 4 ... 5
    la = AdaptiveLookahead(
        max_tokens=10, cost=CostModel(prior_step=0.6, prior_slope=0.05, measure=False), prior_accept=0.75
    )
    values = {k: (sum(0.75**i for i in range(k + 1))) / (1.6 + 0.05 * k) for k in range(1, 11)}
    assert la.choose(2, available=10) == max(values, key=values.get)
    assert 0 < la.choose(2, available=10) < 10


def test_expected_gain_rule_golden():
    """Prior cost(k) = 1 + 0.6 [k > 0] + 0.05 k: the first token must lift E from 1 to >= 1.65."""
    rule = ExpectedGainRule.after([], CostModel(measure=False))
    assert rule.threshold() == pytest.approx(0.65)  # (1 + p) / 1.65 >= 1 / 1
    rule.extend(0.7)  # E = 1.7, reach 0.7
    assert rule.threshold() == pytest.approx(1.7 * (1.70 / 1.65 - 1) / 0.7)  # 0.0736
    rule.extend(0.5)  # E = 2.05, reach 0.35
    assert rule.threshold() == pytest.approx(2.05 * (1.75 / 1.70 - 1) / 0.35)  # 0.1723
    # after two Max-Gram tokens accepted half the time: E = 1.75, reach 0.25
    rule = ExpectedGainRule.after([0.5, 0.5], CostModel(measure=False))
    assert (rule.expected, rule.reach, rule.n) == (1.75, 0.25, 2)
    assert rule.threshold() == pytest.approx(1.75 * (1.75 / 1.70 - 1) / 0.25)  # 0.2059
    # measured: one more row costs 10% more than a plain step
    measured = CostModel()
    measured.observe(0, 0.100)
    measured.observe(1, 0.110)
    assert ExpectedGainRule.after([], measured).threshold() == pytest.approx(0.1)
    assert ExpectedGainRule.after([0.0], measured).threshold() == math.inf


# -- AcceptanceCalibration ------------------------------------------------------------------------------


def test_calibration_trusts_p_until_verdicts_arrive():
    cal = AcceptanceCalibration()
    assert cal(0.5) == pytest.approx(0.5)
    assert cal.floor(0.3) == pytest.approx(0.3)
    assert cal.floor(0.9995) == math.inf


def test_calibration_golden_after_rejections():
    """Ten tokens at p = 0.5, all rejected: pooled r = (0 + 4) / (5 + 4) = 4/9, the [0.4, 0.6) bin
    r = (0 + 4 * 4/9) / (5 + 4) = 16/81; every other bin falls back to the pooled 4/9."""
    cal = AcceptanceCalibration()
    for _ in range(10):
        cal.observe(0.5, False)
    assert cal(0.5) == pytest.approx(0.5 * 16 / 81)
    assert cal(0.7) == pytest.approx(0.7 * 4 / 9)
    # t = 0.3: bins >= 0.8 pass whole (0.3 / (4/9) = 0.675 <= 0.8); [0.6, 0.8) from 0.675 on
    assert cal.floor(0.3) == pytest.approx(0.675)
    # t = 0.05: need 0.1125 in the pooled bins, 0.253 in the rejected one: still below its 0.4 edge
    assert cal.floor(0.05) == pytest.approx(0.1125)
    # t = 0.09: the rejected bin needs 0.456 > 0.4, so the floor stops inside it
    assert cal.floor(0.09) == pytest.approx(0.09 * 81 / 16)


def test_calibration_floor_is_safe_for_every_higher_p():
    torch.manual_seed(0)
    cal = AcceptanceCalibration()
    for p, hit in zip(torch.rand(200).tolist(), (torch.rand(200) < 0.4).tolist()):
        cal.observe(p, hit)
    grid = [i / 1000 for i in range(1001)]
    for t in (0.02, 0.1, 0.2, 0.35, 0.5, 0.8):
        f = cal.floor(t)
        assert all(cal(p) >= t - 1e-9 for p in grid if p >= f)
        assert math.isinf(f) or f == 0.0 or cal(f - 1e-6) < t  # and it is the lowest such floor


def test_rule_floor_uses_the_calibration():
    cal = AcceptanceCalibration()
    for _ in range(10):
        cal.observe(0.5, False)
    rule = ExpectedGainRule.after([], CostModel(measure=False), cal)
    assert rule.threshold() == pytest.approx(0.65)
    assert rule.floor() == pytest.approx(cal.floor(0.65)) and rule.floor() > 0.65
    assert rule.estimate(0.5) == pytest.approx(cal(0.5))


# -- DrafterPayoff -------------------------------------------------------------------------------------------


@pytest.mark.measured_costs  # the rule itself, unpinned
def test_drafter_payoff_consults_until_both_times_are_measured():
    from hf_cascade.core.payoff import DrafterPayoff

    pay = DrafterPayoff()
    assert pay.worth(0.01)  # nothing measured yet
    pay.observe_consult(1.0, 0.004)
    assert pay.worth(0.01)  # no target step measured yet
    pay.observe_verdict(0, 1, None)  # the prefill's step: not measured
    assert pay.worth(0.01) and pay.rate() is None


@pytest.mark.measured_costs  # the rule itself, unpinned
def test_drafter_payoff_golden_rule_and_exploration():
    from hf_cascade.core.payoff import DrafterPayoff

    pay = DrafterPayoff(prior=0.5, strength=2.0, explore_every=4)
    pay.observe_consult(1.0, 0.004)  # one consultation at reach 1: 4 ms
    pay.observe_verdict(1, 3, 0.056)  # one of its tokens accepted, 3 emitted in a 56 ms step
    assert pay.gain_per_reach() == pytest.approx((1 + 2 * 0.5) / (1 + 2))  # g = 2/3
    assert pay.rate() == pytest.approx(3 / 0.060)  # R = 50 tokens per second
    # worth it while reach * 2/3 >= 50 * 4 ms = 0.2, i.e. reach >= 0.3
    assert pay.worth(0.31) and pay.worth(1.0)
    assert [pay.worth(0.29) for _ in range(8)] == [False, False, False, True] * 2  # every 4th refusal explores
    for _ in range(20):  # a drafter the target never agrees with
        pay.observe_consult(1.0, 0.004)
        pay.observe_verdict(0, 3, 0.056)
    assert pay.gain_per_reach() == pytest.approx(2.0 / 23.0)
    assert not pay.worth(1.0)  # 0.087 < 0.2: even at reach 1
    pay.observe_consult(1.0, 0.001)  # a consultation's time is a moving average
    assert pay._consult_seconds == pytest.approx(0.8 * 0.004 + 0.2 * 0.001)


@pytest.mark.measured_costs
def test_drafter_payoff_surcharge_counts_toward_the_consultation_only():
    """The time a consultation's tokens add to the target's step (HSDDW: no cost rule sizes its window) makes
    the consultation dearer; ``R``'s time does not count it twice (the step's time already holds it)."""
    from hf_cascade.core.payoff import DrafterPayoff

    pay = DrafterPayoff()
    pay.observe_consult(1.0, 0.004, surcharge=0.010)
    pay.observe_verdict(1, 3, 0.060)
    assert pay.rate() == pytest.approx(3 / 0.064)
    assert pay._consult_seconds == pytest.approx(0.014)
    # g = 2/3 against R * t = 46.9 * 14 ms = 0.656: worth it at reach 1, not at 0.9 (0.6); 4 ms alone: 0.19
    assert pay.worth(1.0) and not pay.worth(0.9)


@pytest.mark.measured_costs
def test_drafter_payoff_values_a_token_at_the_generations_rate():
    """An accepted drafter token is worth 1 / R seconds: the same drafter and forward pay beside a target that
    emits one token per step and not beside one that emits four."""
    from hf_cascade.core.payoff import DrafterPayoff

    slow, fast = DrafterPayoff(), DrafterPayoff()
    for pay, emitted in ((slow, 1), (fast, 4)):
        for _ in range(10):
            pay.observe_consult(1.0, 0.005)
            pay.observe_verdict(1 if _ % 4 == 0 else 0, emitted, 0.045)  # g about 0.3
    assert slow.worth(1.0) and not fast.worth(1.0)


def test_frozen_calibration_gives_the_same_values_until_the_next_verdict():
    import random

    rng = random.Random(0)
    cal = AcceptanceCalibration()
    for _ in range(50):
        cal.observe(rng.random(), rng.random() < 0.5)
    frozen = cal.frozen()
    probs = [0.0, 0.2, 0.5, 0.9, 1.0, 1.2] + [rng.random() for _ in range(200)]
    assert [frozen(p) for p in probs] == [cal(p) for p in probs]  # equal floats, not close ones
    cal.observe(0.95, False)
    assert frozen(0.95) != cal(0.95)  # a snapshot: the verdict is not in it
