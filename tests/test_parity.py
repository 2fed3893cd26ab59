"""``hf_cascade.parity``: the first divergence of two greedy outputs and its logit gap (the rule that tells a bf16
tie from a real mismatch in examples/gpu_check.py), on golden logits and on a tiny bf16 target."""

from __future__ import annotations

import math

import pytest
import torch

from hf_cascade.parity import TIE_ULPS, divergence, first_divergence, logit_gap, ulp
from tests import tiny_models as tm
from tests.test_greedy_parity import REPETITIVE
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)


def test_ulp_of_the_dtype_at_a_magnitude():
    assert ulp(1.0, torch.bfloat16) == 2.0**-7
    assert ulp(20.0, torch.bfloat16) == ulp(-20.0, torch.bfloat16) == 0.125  # 16 <= 20 < 32: 2^4 * 2^-7
    assert ulp(0.75, torch.float16) == 2.0**-11
    assert ulp(3.0, torch.float32) == 2.0**-22
    assert ulp(0.0, torch.bfloat16) == torch.finfo(torch.bfloat16).tiny * 2.0**-7
    assert torch.tensor(20.0, dtype=torch.bfloat16) + ulp(20.0, torch.bfloat16) / 2 == 20.0  # below it: rounds away


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], torch.tensor([1, 5, 3])) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2


def test_logit_gap_golden():
    row = torch.full((8,), -5.0)
    row[3], row[6], row[1] = 20.0, 19.75, 18.0  # top-1, top-2, third
    runner_up = logit_gap(row, 9, expected=3, got=6, dtype=torch.bfloat16)
    assert (runner_up.top1, runner_up.top2, runner_up.gap, runner_up.got_gap) == (20.0, 19.75, 0.25, 0.25)
    assert runner_up.tolerance == TIE_ULPS * 0.125 == 0.5 and runner_up.tie  # 2 ulps: a tie
    third = logit_gap(row, 9, expected=3, got=1, dtype=torch.bfloat16)
    assert third.gap == 0.25 and third.got_gap == 2.0 and not third.tie  # 16 ulps below top-1: a mismatch
    assert not logit_gap(row, 9, 3, 6, dtype=torch.float32).tie  # float32: 0.25 is far from rounding
    assert logit_gap(row, 9, 3, 6, torch.bfloat16, ulps=1).tie is False  # the rule's width is a parameter
    ended = logit_gap(row, 9, expected=3, got=-1, dtype=torch.bfloat16)
    assert ended.got_gap == math.inf and not ended.tie


@pytest.fixture(scope="module")
def bf16_target():
    return tm.llama_target().to(torch.bfloat16)


def test_divergence_on_a_bf16_target(bf16_target):
    """A plain bf16 output against the same output with one token replaced: the divergence is found where it is,
    its gap read from the target's logits after the plain path's prefix."""
    model = bf16_target
    plain = model.generate(REPETITIVE, do_sample=False, max_new_tokens=8)[0].tolist()
    assert divergence(model, plain, plain) is None
    p = REPETITIVE.shape[1] + 3
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([plain[:p]])).logits[0, -1].float()
    order = logits.argsort(descending=True).tolist()
    assert order[0] == plain[p]
    runner_up = divergence(model, plain, plain[:p] + [order[1]] + plain[p + 1 :])
    assert (runner_up.position, runner_up.expected, runner_up.got) == (p, plain[p], order[1])
    assert runner_up.gap == runner_up.got_gap == float(logits[order[0]] - logits[order[1]])
    assert runner_up.tolerance == TIE_ULPS * ulp(float(logits[order[0]]), torch.bfloat16)
    assert runner_up.tie == (runner_up.gap <= runner_up.tolerance)
    last = divergence(model, plain, plain[:p] + [order[-1]])  # the least likely token
    assert last.position == p and last.got_gap == float(logits[order[0]] - logits[order[-1]]) and not last.tie
