"""HSDDW's self-verify rules on hand-made distributions: the entropy, the stop rule, the threshold
(mean entropy of rejected tokens) and the draft stage (Algorithm 1's inner loop)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper

from hf_cascade.core.stats import LevelStats
from hf_cascade.drafters.neural import NeuralLevel
from hf_cascade.hsddw import EntropyThreshold, draft_and_self_verify, entropy, self_verify_length
from tests import tiny_models as tm
from tests.test_greedy_parity import REPETITIVE
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

INF = float("inf")

# -- the rules on hand-made distributions -------------------------------------------------------------


def test_entropy_golden():
    probs = torch.tensor([[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0], [0.7, 0.2, 0.1, 0.0]])
    expected = [math.log(4), 0.0, math.log(2), -(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1))]
    torch.testing.assert_close(entropy(probs), torch.tensor(expected))


def test_stop_rule_keeps_the_first_uncertain_token():
    assert self_verify_length([0.1, 0.2, 1.5, 0.1], tau=1.0) == 3  # H > tau at position 3: kept, then stop
    assert self_verify_length([0.1, 0.2, 0.3], tau=1.0) == 3  # never uncertain: the whole window
    assert self_verify_length([1.0, 1.0, 2.0], tau=1.0) == 3  # H == tau continues
    assert self_verify_length([0.3, 0.1], tau=0.0) == 1  # the paper's tau = 0: one token
    assert self_verify_length([0.0, 0.0, 0.2], tau=0.0) == 3  # ... unless the drafter is certain
    assert self_verify_length(torch.tensor([5.0, 0.0]), tau=INF) == 2  # inf: fixed windows
    assert self_verify_length([], tau=0.0) == 0


def test_threshold_is_the_mean_entropy_of_rejected_tokens():
    t = EntropyThreshold(0.0)
    assert t.value == 0.0
    assert t.update(1.0) == 1.0
    assert t.update(2.0) == 1.5
    assert t.update(0.0) == 1.0
    assert t.rejected == [1.0, 2.0, 0.0]
    started_high = EntropyThreshold(5.0)
    assert started_high.value == 5.0 and started_high.update(1.0) == 1.0  # the start is not part of the mean
    for bad in (-0.1, float("nan")):
        with pytest.raises(ValueError, match=">= 0"):
            EntropyThreshold(bad)


class StubLevel:
    """A drafter whose processed scores at sequence length ``L`` are ``table[L]``."""

    def __init__(self, table):
        self.table = table

    def scores(self, seq, start):
        assert start == seq.shape[0]
        return self.table[seq.shape[0]][None]


def _scores_with_entropy(top: int, sharp: bool) -> torch.Tensor:
    s = torch.full((8,), -1e9) if sharp else torch.zeros(8)
    s[top] = 0.0 if sharp else 1.0
    return s


@pytest.mark.parametrize("do_sample", [False, True])
def test_draft_stage_on_hand_made_distributions(do_sample):
    seq = torch.tensor([1, 4])
    # lengths 2, 3 certain (H = 0), length 4 flat (H > 0), length 5 certain
    table = {
        2: _scores_with_entropy(5, True),
        3: _scores_with_entropy(6, True),
        4: _scores_with_entropy(7, False),
        5: _scores_with_entropy(3, True),
    }
    out = draft_and_self_verify(StubLevel(table), seq, window=10, tau=0.0, do_sample=do_sample, stop_ids=set())
    assert out.tokens.shape[0] == 3  # the uncertain third token is kept
    assert out.tokens[:2].tolist() == [5, 6]
    assert out.entropies[:2].tolist() == [0.0, 0.0] and float(out.entropies[2]) > 0.0
    if do_sample:
        torch.testing.assert_close(out.dists, torch.stack([table[n].softmax(-1) for n in (2, 3, 4)]))
    else:
        assert out.dists is None and int(out.tokens[2]) == 7
    assert draft_and_self_verify(StubLevel(table), seq, 2, 0.0, do_sample, set()).tokens.shape[0] == 2  # window cap
    assert draft_and_self_verify(StubLevel(table), seq, 4, INF, do_sample, set()).tokens.shape[0] == 4
    assert draft_and_self_verify(StubLevel(table), seq, 10, INF, do_sample, {6}).tokens.tolist() == [5, 6]  # EOS


def test_draft_stage_entropy_is_on_the_processed_distribution():
    model = tm.llama_target()
    procs = LogitsProcessorList([TemperatureLogitsWarper(0.5)])
    level = NeuralLevel(model, tm.VOCAB, procs, LevelStats("d"))
    seq = REPETITIVE[0]
    out = draft_and_self_verify(level, seq, 3, INF, False, set())
    full = torch.cat([seq, out.tokens])
    with torch.no_grad():
        logits = model(full[None]).logits[0, seq.shape[0] - 1 : -1].float()
    torch.testing.assert_close(out.entropies, entropy((logits / 0.5).softmax(-1)), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(out.entropies, entropy(logits.softmax(-1)), atol=1e-2)
