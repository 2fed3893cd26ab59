"""KernelTuner (hf_cascade/backends/cpu/kernels.py): explores each kernel on the real calls, then keeps the fastest."""

from __future__ import annotations

import gc

import pytest
import torch

from hf_cascade.backends.cpu.kernels import KernelTuner, WeightPacker, rows_bucket, shape_key


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
    tuner.run("k1", _kernels(clock, log, {"linear": 1.0, "pad2": 2.0}))  # force not offered: tuned
    assert log == ["rows"] * 3 + ["linear"]
    log.clear()
    free = KernelTuner(clock=clock)
    free.run("only", _kernels(clock, log, {"linear": 1.0}))
    assert log == ["linear"] and free.choices() == {}


def test_keys():
    assert [rows_bucket(m) for m in (1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 64)] == [1, 2, 3, 4, 5, 8, 16, 16, 32, 64, 64]
    w = torch.zeros(6, 4)
    assert shape_key(w, 9) == shape_key(w, 16) != shape_key(w, 8)
    assert shape_key(w, 2) != shape_key(w.T.contiguous().T, 2)  # same shape, other layout


def test_packer_products_repack_after_updates_and_drop_with_the_weight():
    """``packed`` computes ``F.linear`` (another accumulation order), packs a weight once, packs again
    after an in-place update (an optimizer step), and forgets the copy when the weight is freed."""
    packer = WeightPacker()
    lin = torch.nn.Linear(48, 96)
    if not packer.offers(lin.weight):
        pytest.skip("this torch build has no oneDNN")
    x = torch.randn(5, 48)
    torch.testing.assert_close(
        packer.product(lin.weight, x, lin.bias),
        torch.nn.functional.linear(x, lin.weight, lin.bias),
        rtol=1e-5,
        atol=1e-5,
    )
    first = packer.packed(lin.weight)
    assert packer.packed(lin.weight) is first  # packed once
    with torch.no_grad():
        lin.weight.mul_(2.0)
    assert packer.packed(lin.weight) is not first  # stale after the update
    torch.testing.assert_close(packer.product(lin.weight, x[:1]), x[:1] @ lin.weight.T, rtol=1e-5, atol=1e-5)
    assert len(packer._packed) == 1
    del lin, first
    gc.collect()
    assert packer._packed == {}


def test_packer_offers_only_float32_cpu_weights_when_enabled():
    w = torch.randn(8, 4)
    assert WeightPacker(enabled=False).offers(w) is False
    assert WeightPacker().offers(w.to(torch.bfloat16)) is False
    assert WeightPacker().offers(torch.randn(8)) is False


def test_a_confirmed_choice_is_rechecked_less_and_less_often():
    """Each recheck that keeps the choice doubles the key's interval (4, 8, 16 uses). Golden: with 3
    trials of two kernels, exploring takes 6 calls (alternating); the slower kernel ``rows`` runs only then."""
    clock, log = _Clock(), []
    tuner = KernelTuner(clock=clock, recheck_every=4)
    for _ in range(50):
        tuner.run("k", _kernels(clock, log, {"linear": 1.0, "rows": 3.0}))
    rows_calls = [i + 1 for i, name in enumerate(log) if name == "rows"]
    # explore 1-6; 3 uses; explore 10-15; 7 uses; explore 23-28; 15 uses; explore from 44
    assert rows_calls == [2, 4, 6, 11, 13, 15, 24, 26, 28, 45, 47, 49]
    assert tuner.choices() == {"k": "linear"}  # decided again at call 49


def test_a_packing_failure_falls_back_to_linear_and_stops_offering():
    class Refusing(WeightPacker):
        def packed(self, weight):
            raise RuntimeError("no oneDNN layout for this weight")

    packer, w, x = Refusing(), torch.randn(6, 4), torch.randn(3, 4)
    assert torch.equal(packer.product(w, x), torch.nn.functional.linear(x, w))
    assert packer.enabled is False and packer.offers(w) is False


def test_a_choice_no_longer_offered_is_explored_again():
    clock, log = _Clock(), []
    tuner = KernelTuner(clock=clock)
    for _ in range(6):
        tuner.run("k", _kernels(clock, log, {"linear": 2.0, "packed": 1.0}))
    assert tuner.choices() == {"k": "packed"}
    log.clear()
    out = tuner.run("k", _kernels(clock, log, {"linear": 2.0, "rows": 3.0}))  # packing turned off since
    assert log == ["linear"] and out.tolist() == [1.0]


def test_a_choice_is_rechecked_and_follows_the_machine():
    """After ``recheck_every`` calls the key is explored again: a choice timed under load does not stay."""
    clock, log = _Clock(), []
    tuner = KernelTuner(clock=clock, recheck_every=5)
    costs = {"linear": 1.0, "packed": 3.0}  # "packed" looks slow (the machine was busy)
    for _ in range(6):
        tuner.run("k", _kernels(clock, log, costs))
    assert tuner.choices() == {"k": "linear"}
    log.clear()
    costs["packed"] = 0.5  # the load is gone
    for _ in range(4):
        tuner.run("k", _kernels(clock, log, costs))
    assert log == ["linear"] * 4  # uses 1-4 of the choice
    for _ in range(6):  # use 5: explore again (3 trials each)
        tuner.run("k", _kernels(clock, log, costs))
    assert log[4:] == ["linear", "packed"] * 3
    assert tuner.choices() == {"k": "packed"} and tuner.seconds("k") == 0.5
    log.clear()
    for _ in range(9):  # the new choice starts at the base interval
        tuner.run("k", _kernels(clock, log, costs))
    assert log == ["packed"] * 4 + ["linear", "packed"] * 2 + ["linear"]  # use 5: explored again
    never = KernelTuner(clock=clock, recheck_every=0)
    for _ in range(20):
        never.run("k", _kernels(clock, log, {"linear": 1.0, "packed": 3.0}))
    assert never.choices() == {"k": "linear"}


def test_a_kernel_far_behind_is_not_explored_at_more_rows():
    """``behind``: a kernel more than twice as slow as the choice at some rows of a weight is left out of the
    exploration of that weight's larger row buckets (not of fewer rows, not of other weights), and comes back
    when measured within reach again at the rows where it fell behind."""
    clock, log = _Clock(), []
    tuner = KernelTuner(clock=clock, recheck_every=0)
    w, other = torch.randn(8, 4), torch.randn(6, 4)
    costs = {"linear": 1.0, "panel": 2.5}
    for _ in range(6):
        tuner.run(shape_key(w, 4), _kernels(clock, log, costs))
    assert tuner.choices() == {shape_key(w, 4): "linear"} and log.count("panel") == 3
    log.clear()
    for m in (5, 16):  # more rows: the choice at once, timed
        for _ in range(3):
            tuner.run(shape_key(w, m), _kernels(clock, log, costs))
    assert log == ["linear"] * 6 and tuner.choices()[shape_key(w, 16)] == "linear"
    assert tuner.seconds(shape_key(w, 16)) == 1.0
    log.clear()
    for key in (shape_key(w, 3), shape_key(other, 16)):  # fewer rows, another weight: explored in full
        for _ in range(6):
            tuner.run(key, _kernels(clock, log, costs))
    assert log.count("panel") == 6
    tuner.run(shape_key(w, 4), _kernels(clock, log, costs))  # recheck_every=0: the choice stays
    recheck = KernelTuner(clock=clock, recheck_every=1)
    for _ in range(6):
        recheck.run(shape_key(w, 4), _kernels(clock, log, costs))
    costs["panel"] = 0.5  # the machine changed: within reach again
    log.clear()
    for _ in range(6):  # the recheck: 3 trials each
        recheck.run(shape_key(w, 4), _kernels(clock, log, costs))
    assert log.count("panel") == 3 and recheck.choices()[shape_key(w, 4)] == "panel"
    log.clear()
    for _ in range(6):
        recheck.run(shape_key(w, 8), _kernels(clock, log, costs))
    assert log.count("panel") == 3  # explored at more rows again
    recheck.reset()
    assert recheck.choices() == {}
