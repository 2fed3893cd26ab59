"""``hf_cascade.timing``: the rules of every run-time timing decision (order, warm-up, median, agreement)."""

import pytest

from hf_cascade.timing import interleaved_medians, median_ratios, round_ratios


def test_rounds_interleave_warmup_is_dropped_and_medians_compare():
    calls, now = [], [0.0]
    cost = {"a": [9.0, 1.0, 3.0, 2.0], "b": [9.0, 5.0, 4.0, 100.0]}  # round 0: a warm-up; b once preempted

    def run(k):
        def fn():
            now[0] += cost[k][sum(c == k for c in calls)]
            calls.append(k)

        return fn

    medians = interleaved_medians({"a": run("a"), "b": run("b")}, repeats=3, clock=lambda: now[0])
    assert calls == ["a", "b"] * 4
    assert medians == {"a": 2.0, "b": 5.0}  # medians of rounds 1-3


def test_symmetric_rounds_sync_and_self_timed():
    calls, synced = [], []
    runs = {n: (lambda n=n: calls.append(n) or float(n)) for n in (0, 1, 2)}
    medians = interleaved_medians(runs, repeats=2, warmup=1, symmetric=True, self_timed=True)
    assert calls == [0, 1, 2] + [0, 1, 2, 2, 1, 0] * 2  # the warm-up round once each
    assert medians == {0: 0.0, 1: 1.0, 2: 2.0}
    interleaved_medians({0: lambda: None}, repeats=2, warmup=0, sync=lambda: synced.append(1))
    assert len(synced) == 4  # before each clock read


def test_symmetric_rounds_cancel_a_linear_drift():
    """A machine speeding up call after call (a process still warming): in plain rounds the alternative timed first
    reads slower than it is; a symmetric round times each once before and once after the round's middle."""
    cost = {1: 1.0, 2: 1.1, 4: 1.3, 8: 1.6}
    calls = [0]

    def run(m):
        def fn():
            calls[0] += 1
            return cost[m] * (1.0 - 0.01 * calls[0])  # every call 1% of the unit faster than the one before

        return fn

    def ratios(**kw):
        calls[0] = 0
        med = interleaved_medians({m: run(m) for m in cost}, repeats=3, warmup=1, self_timed=True, **kw)
        return {m: med[m] / med[1] for m in cost}

    plain, symmetric = ratios(), ratios(symmetric=True)
    assert plain[8] < 1.6 * 0.98  # biased: 8 is timed last in every round
    for m in cost:  # within the drift's second-order term
        assert symmetric[m] == pytest.approx(cost[m], rel=0.003)


def _rounds_of(per_round, calls=None):
    """Self-timed runs reading ``per_round[r][key]`` in timed round ``r`` (both halves of a symmetric round), after
    a warm-up round that reads round 0's; ``calls`` collects the keys called."""
    values = {k: iter([per_round[0][k]] + [r[k] for r in per_round for _ in (0, 1)]) for k in per_round[0]}
    calls = [] if calls is None else calls
    return {k: (lambda k=k: calls.append(k) or next(values[k])) for k in values}


def test_round_ratios_are_within_a_round_and_the_median_outvotes_a_spoiled_one():
    """A transient made the unit (nothing drafted) read fast in one round: every size looked a third dearer, and the
    calls refused their drafts. Ratios are taken within each round (a round slowed evenly keeps them), and the
    median over three rounds keeps the two sound ones'."""
    quiet = {0: 1.0, 1: 1.02, 2: 1.2, 8: 1.8}
    spoiled = {0: 0.75, 1: 1.0, 2: 1.15, 8: 1.22}
    calls = []
    rounds = round_ratios(
        _rounds_of([quiet, spoiled, {k: 1.3 * v for k, v in quiet.items()}], calls), 0, 3, self_timed=True
    )
    assert calls == [0, 1, 2, 8] + [0, 1, 2, 8, 8, 2, 1, 0] * 3  # a warm-up round, then symmetric ones
    assert rounds[0] == pytest.approx(quiet) and rounds[2] == pytest.approx(quiet)
    assert rounds[1][1] == pytest.approx(1.0 / 0.75)
    assert median_ratios(rounds) == pytest.approx(quiet)
