"""KernelTuner (hf_cascade/kernels.py): explores each kernel on the real calls, then keeps the fastest."""

from __future__ import annotations

import torch

from hf_cascade.kernels import KernelTuner, rows_bucket, shape_key


class _Clock:
    """A fake timer that kernels advance by their cost."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _kernels(clock: _Clock, log: list, costs: dict[str, float]):
    def make(name):
        def run():
            log.append(name)
            clock.now += costs[name]
            return torch.tensor([1.0])
        return run
    return {name: make(name) for name in costs}


def test_alternates_then_keeps_the_lowest_median():
    clock, log = _Clock(), []
    tuner = KernelTuner(trials=3, clock=clock)
    kernels = _kernels(clock, log, {"linear": 5.0, "rows": 2.0})
    for _ in range(8):
        tuner.run("k", kernels)
    assert log == ["linear", "rows"] * 3 + ["rows", "rows"]
    assert tuner.choices() == {"k": "rows"}
    # another key explores on its own; a median ignores one slow outlier
    log.clear()
    costs = {"linear": 1.0, "rows": 2.0}
    kernels = _kernels(clock, log, costs)
    for i in range(6):
        costs["linear"] = 9.0 if i == 0 else 1.0
        tuner.run("k2", kernels)
    assert tuner.choices()["k2"] == "linear"
    tuner.reset()
    assert tuner.choices() == {}


def test_force_and_single_kernel():
    clock, log = _Clock(), []
    tuner = KernelTuner(force="rows", clock=clock)
    for _ in range(3):
        tuner.run("k", _kernels(clock, log, {"linear": 1.0, "rows": 2.0}))
    tuner.run("k1", _kernels(clock, log, {"linear": 1.0, "pad2": 2.0}))   # force not offered: tuned
    assert log == ["rows"] * 3 + ["linear"]
    log.clear()
    free = KernelTuner(clock=clock)
    free.run("only", _kernels(clock, log, {"linear": 1.0}))
    assert log == ["linear"] and free.choices() == {}


def test_keys():
    assert [rows_bucket(m) for m in (1, 2, 3, 4, 5, 8, 9, 33, 64)] == [1, 2, 3, 4, 8, 8, 16, 64, 64]
    w = torch.zeros(6, 4)
    assert shape_key(w, 5) == shape_key(w, 7) != shape_key(w, 4)
    assert shape_key(w, 2) != shape_key(w.T.contiguous().T, 2)          # same shape, other layout
