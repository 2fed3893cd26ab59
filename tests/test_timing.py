"""``hf_cascade.timing.interleaved_medians``: the rule of every run-time timing decision (order, warm-up, median)."""

import pytest

from hf_cascade.timing import interleaved_medians


def test_rounds_interleave_warmup_is_dropped_and_medians_compare():
    calls, now = [], [0.0]
    cost = {"a": [9.0, 1.0, 3.0, 2.0], "b": [9.0, 5.0, 4.0, 100.0]}      # round 0: a warm-up; b once preempted

    def run(k):
        def fn():
            now[0] += cost[k][sum(c == k for c in calls)]
            calls.append(k)
        return fn

    medians = interleaved_medians({"a": run("a"), "b": run("b")}, repeats=3, clock=lambda: now[0])
    assert calls == ["a", "b"] * 4
    assert medians == {"a": 2.0, "b": 5.0}                                # medians of rounds 1-3


def test_symmetric_rounds_sync_and_self_timed():
    calls, synced = [], []
    runs = {n: (lambda n=n: calls.append(n) or float(n)) for n in (0, 1, 2)}
    medians = interleaved_medians(runs, repeats=2, warmup=1, symmetric=True, self_timed=True)
    assert calls == [0, 1, 2] + [0, 1, 2, 2, 1, 0] * 2                  # the warm-up round once each
    assert medians == {0: 0.0, 1: 1.0, 2: 2.0}
    interleaved_medians({0: lambda: None}, repeats=2, warmup=0, sync=lambda: synced.append(1))
    assert len(synced) == 4                                                # before each clock read


def test_symmetric_rounds_cancel_a_linear_drift():
    """A machine speeding up call after call (a process still warming): in plain rounds the alternative timed first
    reads slower than it is; a symmetric round times each once before and once after the round's middle."""
    cost = {1: 1.0, 2: 1.1, 4: 1.3, 8: 1.6}
    calls = [0]

    def run(m):
        def fn():
            calls[0] += 1
            return cost[m] * (1.0 - 0.01 * calls[0])          # every call 1% of the unit faster than the one before
        return fn

    def ratios(**kw):
        calls[0] = 0
        med = interleaved_medians({m: run(m) for m in cost}, repeats=3, warmup=1, self_timed=True, **kw)
        return {m: med[m] / med[1] for m in cost}

    plain, symmetric = ratios(), ratios(symmetric=True)
    assert plain[8] < 1.6 * 0.98                                           # biased: 8 is timed last in every round
    for m in cost:                                                         # within the drift's second-order term
        assert symmetric[m] == pytest.approx(cost[m], rel=0.003)
