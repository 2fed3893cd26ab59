"""``hf_cascade.timing.interleaved_medians``: the rule of every run-time timing decision (order, warm-up, median)."""

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


def test_alternate_order_sync_and_self_timed():
    calls, synced = [], []
    runs = {n: (lambda n=n: calls.append(n) or float(n)) for n in (0, 1, 2)}
    medians = interleaved_medians(runs, repeats=2, warmup=1, alternate=True, self_timed=True)
    assert calls == [0, 1, 2, 2, 1, 0, 0, 1, 2]
    assert medians == {0: 0.0, 1: 1.0, 2: 2.0}
    interleaved_medians({0: lambda: None}, repeats=2, warmup=0, sync=lambda: synced.append(1))
    assert len(synced) == 4                                                # before each clock read
