"""The rows per output-head call (hf_cascade/backends/cpu/head_block.py): the priced choice on golden numbers, the
cost curve measured once per process, pooled with the kept rounds and fitted non-decreasing, the cheaper of the
head and the screen at each size, the steps recorded per strategy, and the session that prices and records."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

import hf_cascade
from hf_cascade import MaxGram
from hf_cascade.backends.cpu import head_block
from hf_cascade.backends.cpu.head_block import priced_block, prior_steps, step_cost
from hf_cascade.backends.cpu.kernels import KernelTuner
from hf_cascade.backends.cpu.verify_head import VerificationHead, calibrate_block_rows, calibrated_block_rows
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)


@pytest.fixture(autouse=True)
def new_process(monkeypatch, tmp_path):
    """Each test a new process: no curve, step or choice kept in memory; rounds kept in its own folder."""
    monkeypatch.setenv("HF_CASCADE_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_CASCADE_PROFILE_ROUNDS", "1")
    head_block.reset()
    yield
    head_block.reset()


def test_step_cost_golden():
    costs = (1.0, 1.2, 1.3, 1.5, 1.6, 1.7, 1.8, 2.0)
    assert step_cost(costs, 4, 8, 1) == 1.5  # one call of 4 rows
    assert step_cost(costs, 4, 8, 5) == 3.0  # two of 4
    assert step_cost(costs, 4, 6, 5) == pytest.approx(1.5 + 1.2)  # 4, then the 2 rows left
    assert step_cost(costs, 8, 3, 3) == 1.3  # a call holds at most the rows verified
    assert step_cost(costs, 3, 17, 17) == pytest.approx(5 * 1.3 + 1.2)
    assert step_cost(costs, 1, 8, 3) == 3.0


def test_prior_steps_are_a_truncated_geometric():
    steps = prior_steps(rows=4, p=0.5, weight=8.0)
    assert [(n, r) for n, r, _ in steps] == [(4, 1), (4, 2), (4, 3), (4, 4)]
    assert [w for *_, w in steps] == pytest.approx([4.0, 2.0, 1.0, 1.0])


def test_priced_block_golden():
    flat = (1.0,) * 8
    assert priced_block(flat, prior_steps()) == 8  # rows free: the largest block
    linear = tuple(float(m) for m in range(1, 9))
    assert priced_block(linear, prior_steps()) == 1  # each row a call's cost: no block pays
    screen = (1.0, 1.17, 1.29, 1.44, 1.66, 1.88, 2.09, 2.31)  # a screen's measured curve (Xeon, Gemma's head)
    assert priced_block(screen, prior_steps()) in (3, 4)
    assert priced_block(screen, [(9, 1, 100.0)]) == 1  # paths that end at the root: one row
    assert priced_block(screen, [(9, 9, 100.0)]) == 8  # long paths: one call over 8 rows, one over 1
    costs = (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
    assert priced_block(costs, [(3, 3, 1.0)]) == 8  # ties: the larger


class _Clock(KernelTuner):
    """Kernels chosen at once; a call of m rows advances a fake clock by costs[m] (the tuner's clock)."""

    def __init__(self, costs, now):
        super().__init__(clock=lambda: now["t"])
        self.costs, self.now = costs, now

    def run(self, key, kernels):
        self.now["t"] += self.costs[key.rows]
        return next(iter(kernels.values()))()

    def seconds(self, key):
        return self.costs[key.rows]


def test_curve_pooled_fitted_and_cached(monkeypatch):
    """Measured once per process and head shape; a spoiled process's own round is outvoted by the kept rounds; a
    size timed dearer than a larger one is pooled with it (non-decreasing); ``reuse`` times nothing once enough are
    kept; a forced kernel does not time (the default block)."""
    head = nn.Linear(8, 40000, bias=False)
    now = {"t": 0.0}
    sound = {1: 1.0, 2: 1.02, 3: 1.03, 4: 1.05, 8: 1.1}
    spoiled = {1: 1.0, 2: 1.3, 3: 1.5, 4: 1.9, 8: 2.5}
    chosen = []
    for costs in (sound, sound, spoiled):
        head_block.reset()  # a new process
        chosen.append(calibrate_block_rows(VerificationHead(head, tuner=_Clock(costs, now)), kind="k"))
    assert chosen == [8, 8, 8]
    key = next(iter(head_block._COSTS))
    assert head_block.costs_of(key) == pytest.approx((1.0, 1.02, 1.03, 1.05, 1.0625, 1.075, 1.0875, 1.1))
    before = now["t"]
    assert calibrate_block_rows(VerificationHead(head, tuner=_Clock(spoiled, now)), kind="k") == 8  # cached
    assert now["t"] == before
    monkeypatch.setenv("HF_CASCADE_PROFILE_ROUNDS", "0")  # nothing kept: its own round decides
    head_block.reset()
    assert calibrate_block_rows(VerificationHead(head, tuner=_Clock(spoiled, now)), kind="k") == 3
    monkeypatch.setenv("HF_CASCADE_PROFILE_ROUNDS", "reuse")  # enough kept: untimed
    head_block.reset()
    before = now["t"]
    assert calibrate_block_rows(VerificationHead(head, tuner=_Clock(spoiled, now)), kind="k") == 8
    assert now["t"] == before
    head_block.reset()
    spike = {1: 1.0, 2: 1.05, 3: 2.0, 4: 1.1, 8: 1.2}  # 3 rows timed dear, alone
    monkeypatch.setenv("HF_CASCADE_PROFILE_ROUNDS", "0")
    calibrate_block_rows(VerificationHead(head, tuner=_Clock(spike, now)), kind="k")
    assert head_block.costs_of(key) == pytest.approx((1.0, 1.05) + (4.3 / 3,) * 6)  # 3, 4 and 8 pooled
    assert calibrate_block_rows(VerificationHead(head, tuner=KernelTuner(force="rows")), kind="k") == 4


def test_curve_takes_the_cheaper_of_head_and_screen(monkeypatch):
    """Each size costs what the cheaper product costs: a screen three times cheaper than the head at one row but
    growing faster makes the curve the screen's."""
    monkeypatch.setenv("HF_CASCADE_PROFILE_ROUNDS", "0")
    head = nn.Linear(8, 40000, bias=False)
    now = {"t": 0.0}
    vh = VerificationHead(head, tuner=_Clock({1: 3.0, 2: 3.0, 3: 3.0, 4: 3.0, 8: 3.0}, now))
    screen_cost = {1: 1.0, 2: 1.2, 3: 1.4, 4: 1.6, 8: 4.0}

    def screen(x):
        now["t"] += screen_cost[x.shape[0]]
        return [0] * x.shape[0]

    calibrate_block_rows(vh, screen, kind="k")
    costs = head_block.costs_of(next(iter(head_block._COSTS)))
    assert costs[:4] == pytest.approx((1.0, 1.2, 1.4, 1.6))
    assert costs[7] == pytest.approx(3.0)  # 8 rows: the head's 3.0 beats the screen's 4.0


def test_steps_recorded_per_kind_move_the_block(monkeypatch):
    """A strategy whose paths end at the root gets blocks of one row, one whose paths run long the largest; each
    kind its own; the run's record lists each kind's last choice."""
    monkeypatch.setenv("HF_CASCADE_PROFILE_ROUNDS", "0")
    head = nn.Linear(8, 40000, bias=False)
    now = {"t": 0.0}
    curve = {1: 1.0, 2: 1.17, 3: 1.29, 4: 1.44, 8: 2.31}
    vh = VerificationHead(head, tuner=_Clock(curve, now))
    assert calibrate_block_rows(vh, kind="short") in (3, 4)  # the prior
    head_block.record_steps(next(iter(head_block._COSTS)), "short", [8] * 500, [0] * 500)
    head_block.record_steps(next(iter(head_block._COSTS)), "long", [8] * 500, [8] * 500)
    assert calibrate_block_rows(vh, kind="short") == 1
    assert calibrate_block_rows(vh, kind="long") == 8
    assert {(b["kind"], b["block_rows"]) for b in calibrated_block_rows()} == {("short", 1), ("long", 8)}
    head_block.record_steps(next(iter(head_block._COSTS)), "short", [8] * head_block.WINDOW, [8] * head_block.WINDOW)
    assert calibrate_block_rows(vh, kind="short") == 8  # the window keeps the last steps


def _target(vocab=40000):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(cfg).eval()


def test_the_session_prices_and_records_an_assistants_steps(monkeypatch):
    """An assistant's call on a large-vocabulary float32 target: the CPU session prices the block for its kind and
    records the call's steps; plain decoding under ``hf_cascade.cpu_kernels`` times no block; the output is plain's."""
    monkeypatch.setenv("HF_CASCADE_PROFILE_ROUNDS", "0")
    target = _target()
    prompt = torch.tensor([[1] + [5, 6, 7, 8] * 6])
    ref = target.generate(prompt, max_new_tokens=24, do_sample=False)
    with hf_cascade.cpu_kernels(target):
        plain = target.generate(prompt, max_new_tokens=24, do_sample=False)
    assert torch.equal(plain, ref) and not head_block._COSTS and not calibrated_block_rows()
    assistant = hf_cascade.CascadeAssistant([MaxGram()], cpu_kernels=True)
    out = target.generate(prompt, max_new_tokens=24, do_sample=False, assistant_model=assistant)
    assert torch.equal(out, ref)
    [record] = calibrated_block_rows()
    assert record["kind"] == "CascadeAssistant/1 levels" and record["block_rows"] in head_block.SIZES
    steps = head_block._STEPS[(next(iter(head_block._COSTS)), "CascadeAssistant/1 levels")]
    assert len(steps) == assistant.last_stats.target_calls
    assert sum(r for _, r in steps) == assistant.last_stats.new_tokens
