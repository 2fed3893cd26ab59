"""NeuralLevel: a drafter's KV cache kept across draft steps and rolled back must give the same
scores as a fresh full forward, also through sliding-window layers."""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper

from hf_cascade.core.payoff import CostModel, ExpectedGainRule
from hf_cascade.core.stats import LevelStats
from hf_cascade.drafters.neural import NeuralLevel, check_same_vocabulary, output_vocab_size
from tests import tiny_models as tm
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)


def full_scores(model, seq, start, processors=None):
    with torch.no_grad():
        logits = model(seq[None]).logits[0, start - 1 :, : tm.VOCAB].float()
    if processors:
        logits = torch.stack([processors(seq[None, : start + i], logits[i : i + 1])[0] for i in range(logits.shape[0])])
    return logits


def random_walk(level, model, steps, seed, processors=None, max_back=4):
    """Extend the sequence, score a suffix, accept a random prefix of it, repeat (what drafting and
    reviewing do); compare with a full forward every time."""
    g = torch.Generator().manual_seed(seed)
    cur = torch.tensor([1, 5, 6])
    for step in range(steps):
        adv = int(torch.randint(1, 6, (1,), generator=g))
        back = int(torch.randint(0, max_back + 1, (1,), generator=g))
        full = torch.cat([cur, torch.randint(4, tm.VOCAB, (adv,), generator=g)])
        start = max(1, full.shape[0] - adv - back)
        got = level.scores(full, start)
        torch.testing.assert_close(
            got,
            full_scores(model, full, start, processors),
            atol=1e-4,
            rtol=1e-4,
            msg=lambda s, step=step, full=full, start=start: f"step {step}, length {full.shape[0]}, start {start}: {s}",
        )
        keep = int(torch.randint(start, full.shape[0] + 1, (1,), generator=g))
        cur = full[:keep]


@pytest.mark.parametrize("build", [tm.llama_target, tm.gemma3_target], ids=["llama", "gemma3_sliding8"])
@pytest.mark.parametrize("seed", [0, 1])
def test_cached_scores_match_full_forward_after_rollbacks(build, seed):
    model = build()
    level = NeuralLevel(model, tm.VOCAB, LogitsProcessorList(), LevelStats("d"))
    random_walk(level, model, steps=40, seed=seed)
    assert level.stats.forward_calls == 40


def test_cached_scores_with_processors():
    model = tm.llama_target()
    procs = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5), TemperatureLogitsWarper(0.7)])
    level = NeuralLevel(model, tm.VOCAB, procs, LevelStats("d"))
    random_walk(level, model, steps=15, seed=3, processors=procs)


def test_padded_vocabulary_is_cut_to_the_target_vocabulary():
    target = tm.llama_target()
    padded = tm.padded_vocab_copy(target, extra=32)
    assert output_vocab_size(padded) == tm.VOCAB + 32
    check_same_vocabulary(target, padded)  # no error
    level = NeuralLevel(padded, tm.VOCAB, LogitsProcessorList(), LevelStats("d"))
    seq = torch.tensor([1, 5, 6, 7, 5, 6])
    s = level.scores(seq, 3)
    assert s.shape == (4, tm.VOCAB)
    torch.testing.assert_close(s, full_scores(target, seq, 3), atol=1e-4, rtol=1e-4)


def test_smaller_drafter_vocabulary_is_padded_with_minus_inf():
    target = tm.llama_target()
    level = NeuralLevel(target, tm.VOCAB + 8, LogitsProcessorList(), LevelStats("d"))
    s = level.scores(torch.tensor([1, 5, 6]), 3)
    assert s.shape == (1, tm.VOCAB + 8)
    assert torch.isneginf(s[:, tm.VOCAB :]).all() and torch.isfinite(s[:, : tm.VOCAB]).all()


def test_generate_greedy_and_stop():
    model = tm.llama_target()
    level = NeuralLevel(model, tm.VOCAB, LogitsProcessorList(), LevelStats("d"))
    seq = torch.tensor([1, 5, 6, 7, 5, 6, 7, 5, 6])
    expected = model.generate(seq[None], max_new_tokens=5, do_sample=False)[0, seq.shape[0] :]
    tokens, probs, dists = level.generate(seq, 5, do_sample=False, stop_ids=set())
    assert tokens.tolist() == expected.tolist() and dists is None
    assert probs.shape == (5,) and ((probs > 0) & (probs <= 1)).all()
    stop = int(expected[2])
    tokens, _, _ = level.generate(seq, 5, do_sample=False, stop_ids={stop})
    assert tokens.tolist() == expected[: expected.tolist().index(stop) + 1].tolist()
    tokens, probs, dists = level.generate(seq, 3, do_sample=True, stop_ids=set())
    assert tokens.shape == (3,) and dists.shape == (3, tm.VOCAB)
    torch.testing.assert_close(dists.sum(-1), torch.ones(3))
    torch.testing.assert_close(probs, dists[torch.arange(3), tokens])


@pytest.mark.parametrize("threshold", [0.0, 0.05, 0.2, 1.0])
def test_min_confidence_keeps_or_drops_the_unsure_token(threshold):
    """``generate`` stops at the first token below ``min_confidence``: kept (transformers' rule) or
    dropped (``keep_unsure=False``), so that every drafted token is one the drafter was sure of."""
    model = tm.llama_target()
    seq = torch.tensor([1, 5, 6, 7, 5, 6])
    kept = NeuralLevel(model, tm.VOCAB, LogitsProcessorList(), LevelStats("d")).generate(
        seq, 6, False, set(), threshold
    )
    dropped = NeuralLevel(model, tm.VOCAB, LogitsProcessorList(), LevelStats("d")).generate(
        seq, 6, False, set(), threshold, keep_unsure=False
    )
    k_tokens, k_probs, _ = kept
    d_tokens, d_probs, _ = dropped
    assert bool((k_probs[:-1] >= threshold).all())
    if k_tokens.shape[0] < 6 or float(k_probs[-1]) < threshold:  # stopped at an unsure token
        assert float(k_probs[-1]) < threshold
        assert d_tokens.tolist() == k_tokens[:-1].tolist()
    else:
        assert d_tokens.tolist() == k_tokens.tolist()
    assert bool((d_probs >= threshold).all())
    if threshold == 1.0:
        assert d_tokens.shape[0] == 0 and k_tokens.shape[0] == 1
    if threshold == 0.0:
        assert d_tokens.shape[0] == k_tokens.shape[0] == 6


def test_no_forward_when_the_rule_cannot_be_met():
    """After a long draft whose end is unlikely to be reached, no drafter token could pay for its
    verification (threshold > 1): ``generate`` returns nothing without running the drafter."""
    model = tm.llama_target()
    seq = torch.tensor([1, 5, 6, 7, 5, 6])
    stats = LevelStats("d")
    level = NeuralLevel(model, tm.VOCAB, LogitsProcessorList(), stats)
    hopeless = ExpectedGainRule.after([0.3] * 10, CostModel(measure=False))
    assert hopeless.threshold() > 1.0
    tokens, probs, _ = level.generate(seq, 3, False, set(), rule=hopeless)
    assert tokens.shape[0] == 0 and stats.forward_calls == 0
    tokens, _, _ = level.generate(seq, 3, False, set(), rule=ExpectedGainRule.after([], CostModel(measure=False)))
    assert stats.forward_calls >= 1


def test_dropping_by_probability_hands_over_the_restricted_distribution():
    """Under sampling a token kept only because ``q(x) >= floor`` was drawn from ``q`` restricted to
    ``{q >= floor}``: that renormalised row is what verification gets (exact speculative sampling)."""
    model = tm.noisy_copy(tm.llama_target(), noise=0.3)
    seq = torch.tensor([1, 5, 6, 7, 5, 6])
    floor = 0.02
    for seed in range(8):
        torch.manual_seed(seed)
        level = NeuralLevel(model, tm.VOCAB, LogitsProcessorList(), LevelStats("d"))
        tokens, probs, dists = level.generate(seq, 4, True, set(), floor, keep_unsure=False)
        ref = NeuralLevel(model, tm.VOCAB, LogitsProcessorList(), LevelStats("d"))
        for i in range(tokens.shape[0]):
            q = ref.scores(torch.cat([seq, tokens[:i]]), seq.shape[0] + i)[-1].softmax(-1)
            expected = torch.where(q >= floor, q, torch.zeros_like(q))
            torch.testing.assert_close(dists[i], expected / expected.sum())
            assert float(probs[i]) == pytest.approx(float(q[tokens[i]]))
            assert float(q[tokens[i]]) >= floor
