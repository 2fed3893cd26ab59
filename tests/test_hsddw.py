"""HSDDW (``DynamicWindowAssistant``): the self-verify rules checked in situ against independent forwards,
greedy parity, reuse, errors (sampling: ``test_hsddw_sampling.py``; the rules on hand-made inputs:
``test_hsddw_rules.py``; the Max-Gram lookup first, on by default: ``test_hsddw_lookup.py``; the in-situ rule checks
turn it off).

Greedy helpers and tiny models come from ``tests/test_greedy_parity.py``; the statistical tests
(per-step calibration, lying ``q``) from ``tests/test_sampling.py``. The contract's HSDDW entry (two draft
models, max_window 4: parity on every target setting with processors, exact sampling, no state leak):
``tests/test_contract.py``.
"""

from __future__ import annotations

import time

import pytest
import torch
from transformers import pipeline

from hf_cascade import DynamicWindowAssistant, DynamicWindowSettings, DynamicWindowStats, MaxGram, Policy
from hf_cascade.hsddw import entropy
from tests import tiny_models as tm
from tests.test_contract import FakeClock
from tests.test_greedy_parity import ONE_TOKEN, REPETITIVE, Collect, assert_parity, m, ours, plain  # noqa: F401  (m: fixture)
from tests.test_sampling import PROMPT, _lying_q, calibration, passes, processed_probs, run_long, small  # noqa: F401
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

INF = float("inf")


# -- the rules in situ: windows and thresholds against independent forwards ----------------------------


def _entropies_along(model, out: torch.Tensor) -> torch.Tensor:
    """``h[t]``: entropy of ``model``'s next-token distribution given ``out[:t]`` (index ``t >= 1``)."""
    with torch.no_grad():
        logits = model(out[None]).logits[0, :, : tm.VOCAB].float()
    return torch.cat([torch.zeros(1), entropy(logits.softmax(-1))])


NO_EOS = {"eos_token_id": tm.VOCAB + 7}  # a stop token no model can emit: every window end is the stop rule's


def _check_windows(stats, window_model, out, prompt_len, max_new, caps, taus, tau_init):
    """Replay the target steps: inside every window the entropies of ``window_model`` (the model whose
    distributions are handed to the target) stay <= tau and the window ends after one above tau,
    unless it hit its cap; the target's rejections give the threshold sequence ``taus``."""
    h = _entropies_along(window_model, out[0])
    start, rejected = prompt_len, []
    for i, (k, n) in enumerate(zip(stats.draft_len_per_call, stats.accepted_per_call)):
        if i >= len(taus):
            break
        tau = sum(rejected) / len(rejected) if rejected else tau_init
        assert taus[i] == pytest.approx(tau), (i, taus[i], tau)
        cap = min(caps, prompt_len + max_new - start - 1)
        for j in range(min(k, n + 1)):  # positions whose distribution is conditioned on the output
            if j < k - 1:
                assert h[start + j] <= tau + 1e-5, (i, j)
            elif k < cap:
                assert h[start + j] > tau - 1e-5, (i, j)
        if n < k:
            rejected.append(float(h[start + n]))
        start += n + 1
    return rejected


@pytest.mark.parametrize("tau_init", [0.0, 1.9])
def test_sd_self_verify_windows_and_threshold_in_situ(m, tau_init):
    target, drafter = m["target"], m["noisy"]
    a = DynamicWindowAssistant(
        drafter, settings=DynamicWindowSettings(max_window=6, tau_init=tau_init), policy=Policy(lookup=False)
    )  # the paper's rules alone
    stats = assert_parity(target, REPETITIVE, a, max_new_tokens=40, **NO_EOS)
    out = ours(target, REPETITIVE, a, max_new_tokens=40, **NO_EOS)
    rejected = _check_windows(a.last_stats, drafter, out, REPETITIVE.shape[1], 40, 6, stats.tau_trajectory, tau_init)
    assert stats.rejected_entropies == pytest.approx(rejected, abs=1e-5)
    assert len(rejected) >= 2 and stats.draft_windows == stats.draft_len_per_call[: len(stats.draft_windows)]
    assert max(stats.draft_windows) > 1


def test_hsddw_windows_and_thresholds_in_situ(m):
    target, small_model, verifier = m["target"], m["noisy"], m["big"]
    a = DynamicWindowAssistant(
        small_model,
        verifier,
        settings=DynamicWindowSettings(max_window=3, tau_init=2.0, tau2_init=1.5, max_target_window=8),
        policy=Policy(lookup=False),
    )
    stats = assert_parity(target, REPETITIVE, a, max_new_tokens=40, **NO_EOS)
    out = ours(target, REPETITIVE, a, max_new_tokens=40, **NO_EOS)
    rejected2 = _check_windows(a.last_stats, verifier, out, REPETITIVE.shape[1], 40, 8, stats.tau2_trajectory, 1.5)
    assert stats.rejected_entropies2 == pytest.approx(rejected2, abs=1e-5)
    # the small model's tau: the running mean of its rejected entropies, in order
    means = [2.0] + [sum(stats.rejected_entropies[:r]) / r for r in range(1, len(stats.rejected_entropies) + 1)]
    pos = 0
    for tau in stats.tau_trajectory:
        while tau != pytest.approx(means[pos]):
            pos += 1
    assert len(stats.rejected_entropies) >= 1 and max(stats.window_per_step) > 1
    assert len(stats.draft_windows) > stats.target_calls  # several draft stages per target step
    assert all(1 <= w <= 3 for w in stats.draft_windows)


# -- greedy parity ------------------------------------------------------------------------------------

CONFIGS = {
    "sd_w1": lambda m: DynamicWindowAssistant(m["noisy"], settings=DynamicWindowSettings(max_window=1)),
    "sd_w4": lambda m: DynamicWindowAssistant(m["trunc"], settings=DynamicWindowSettings(max_window=4)),
    "sd_w16_tau2": lambda m: DynamicWindowAssistant(
        m["noisy"], settings=DynamicWindowSettings(max_window=16, tau_init=2.0)
    ),
    "sd_w16_fixed": lambda m: DynamicWindowAssistant(
        m["noisy"], settings=DynamicWindowSettings(max_window=16, tau_init=INF)
    ),
    "sd_padded": lambda m: DynamicWindowAssistant(
        m["padded"], settings=DynamicWindowSettings(max_window=4, tau_init=INF)
    ),
    "hsddw_w1": lambda m: DynamicWindowAssistant(m["noisy"], m["big"], settings=DynamicWindowSettings(max_window=1)),
    "hsddw_w4": lambda m: DynamicWindowAssistant(
        m["trunc"], m["big"], settings=DynamicWindowSettings(max_window=4, tau_init=2.0, tau2_init=2.0)
    ),
    "hsddw_w16": lambda m: DynamicWindowAssistant(
        m["noisy"], m["trunc"], settings=DynamicWindowSettings(max_window=16, tau_init=2.0, tau2_init=2.2)
    ),
    "hsddw_w4_fixed": lambda m: DynamicWindowAssistant(
        m["noisy"], m["big"], settings=DynamicWindowSettings(max_window=4, tau_init=INF, tau2_init=INF)
    ),
    # the paper's drafters alone (every config above also runs the Max-Gram lookup first)
    "sd_w4_no_lookup": lambda m: DynamicWindowAssistant(
        m["noisy"], settings=DynamicWindowSettings(max_window=4, tau_init=2.0), policy=Policy(lookup=False)
    ),
    "hsddw_w4_no_lookup": lambda m: DynamicWindowAssistant(
        m["trunc"],
        m["big"],
        settings=DynamicWindowSettings(max_window=4, tau_init=2.0, tau2_init=2.0),
        policy=Policy(lookup=False),
    ),
}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("prompt", [REPETITIVE, ONE_TOKEN], ids=["repetitive", "one_token"])
def test_greedy_parity(m, config, prompt):
    a = CONFIGS[config](m)
    stats = assert_parity(m["target"], prompt, a)
    assert isinstance(stats, DynamicWindowStats)
    assert all(w <= a.settings.max_window for w in stats.draft_windows)
    assert all(w <= a.settings.target_window for w in stats.window_per_step)
    names = [lv.name for lv in stats.levels]
    assert len(names) == (2 if a.verifier_model is not None else 1) + a.lookup
    assert ("maxgram" in names) == a.lookup == (names[-1] == "maxgram") and stats.lookup == a.lookup
    steps = stats.levels[0].proposals + (stats.levels[-1].proposals if a.lookup else 0)  # target steps by who drafted
    assert steps == sum(k > 0 for k in stats.window_per_step)


def test_greedy_parity_with_processors(m):
    """SD + self-verify (the contract's HSDDW with processors: tests/test_contract.py)."""
    kw = {"repetition_penalty": 1.5, "no_repeat_ngram_size": 3}
    assert_parity(
        m["target"],
        REPETITIVE,
        DynamicWindowAssistant(m["noisy"], settings=DynamicWindowSettings(max_window=4, tau_init=2.0)),
        **kw,
    )


def test_long_windows_are_used(m):
    """With an exact copy as draft and ``tau = inf`` every window is full and fully accepted."""
    a = DynamicWindowAssistant(
        m["copy"], settings=DynamicWindowSettings(max_window=4, tau_init=INF), policy=Policy(lookup=False)
    )
    stats = assert_parity(m["target"], REPETITIVE, a, max_new_tokens=30)
    assert stats.window_per_step == [4] * 6 and stats.accepted_per_call == [4] * 6
    assert stats.redundancy == 0.0 and stats.target_utilization == pytest.approx(6 / 30)
    assert stats.calls_per_model == {"target": 6, "draft": 6 * 4}


@pytest.mark.parametrize("config", ["sd", "hsddw"])
def test_eos_inside_a_window(m, config):
    target = m["target"]
    free = plain(target, REPETITIVE, max_new_tokens=40)[0, REPETITIVE.shape[1] :].tolist()
    eos = free[6]
    first = free.index(eos)
    a = (
        DynamicWindowAssistant(m["copy"], settings=DynamicWindowSettings(max_window=8, tau_init=INF))
        if config == "sd"
        else DynamicWindowAssistant(
            m["copy"], m["big"], settings=DynamicWindowSettings(max_window=3, tau_init=INF, tau2_init=INF)
        )
    )
    expected = plain(target, REPETITIVE, max_new_tokens=40, eos_token_id=eos)
    got = ours(target, REPETITIVE, a, max_new_tokens=40, eos_token_id=eos)
    assert got.tolist() == expected.tolist()
    assert got.shape[1] == REPETITIVE.shape[1] + first + 1 and int(got[0, -1]) == eos
    assert a.last_stats.new_tokens == first + 1
    assert a.last_stats.window_per_step[-1] < (8 if config == "sd" else a.settings.target_window)


@pytest.mark.parametrize("new", [1, 2, 3, 5])
@pytest.mark.parametrize("config", ["sd", "hsddw"])
def test_max_new_tokens_reached_mid_window(m, new, config):
    a = (
        DynamicWindowAssistant(m["copy"], settings=DynamicWindowSettings(max_window=4, tau_init=INF))
        if config == "sd"
        else DynamicWindowAssistant(
            m["copy"], m["trunc"], settings=DynamicWindowSettings(max_window=4, tau_init=INF, tau2_init=INF)
        )
    )
    stats = assert_parity(m["target"], REPETITIVE, a, max_new_tokens=new)
    assert stats.new_tokens == new
    assert all(k <= new - 1 for k in stats.window_per_step)


# -- reuse ------------------------------------------------------------------------------------------


def _copying_prompt(m) -> torch.Tensor:
    """REPETITIVE and the target's first 20 greedy tokens: the target's outputs cycle from there, so what it
    says next copies the prompt and the lookup's proposals get accepted."""
    return plain(m["target"], REPETITIVE, max_new_tokens=20, **NO_EOS)


def _comparable(stats) -> dict:
    d = stats.to_dict()
    d.pop("phase_seconds")
    return d


@pytest.mark.parametrize("config", ["sd", "hsddw"])
def test_pipeline_and_streaming(m, config):
    """Algorithms 1 and 2 through ``pipeline("text-generation")`` and with a streamer, like the cascade."""
    target, tok = m["target"], tm.word_tokenizer()
    text = "w5 w6 w7 w5 w6 w7 w5 w6"
    kw = dict(max_new_tokens=20, do_sample=False)
    expected = pipeline("text-generation", model=target, tokenizer=tok)(text, **kw)[0]["generated_text"]
    assistant = DynamicWindowAssistant(m["trunc"], verifier_model=m["noisy"] if config == "hsddw" else None)
    pipe = pipeline("text-generation", model=target, tokenizer=tok)
    assert pipe(text, assistant_model=assistant, **kw)[0]["generated_text"] == expected
    assert assistant.last_stats is not None and assistant.last_stats.new_tokens == 20
    ref, got = Collect(), Collect()
    expected_ids = plain(target, REPETITIVE, streamer=ref)
    out = ours(target, REPETITIVE, assistant, streamer=got)
    assert out.tolist() == expected_ids.tolist()
    flat = [t for chunk in got.chunks for t in chunk]
    assert flat == [t for chunk in ref.chunks for t in chunk] and got.ended == 1


def test_reuse_without_state_leaks(m, monkeypatch):
    monkeypatch.setattr(time, "perf_counter", FakeClock())  # the lookup's measured verify cost: deterministic
    target = m["target"]
    g = torch.Generator().manual_seed(5)
    prompts = [REPETITIVE, _copying_prompt(m), ONE_TOKEN] + [
        ids(*torch.randint(4, tm.VOCAB, (int(n),), generator=g).tolist())
        for n in torch.randint(1, 10, (3,), generator=g)
    ]
    # SD + self-verify; HSDDW (two draft models): tests/test_contract.py
    make = {
        "sd": lambda: DynamicWindowAssistant(m["noisy"], settings=DynamicWindowSettings(max_window=4)),
        "sd_no_lookup": lambda: DynamicWindowAssistant(
            m["noisy"], settings=DynamicWindowSettings(max_window=4), policy=Policy(lookup=False)
        ),
    }
    for name, build in make.items():
        reused, seen = build(), []
        for prompt in prompts:
            fresh = build()
            a = ours(target, prompt, reused, max_new_tokens=15)
            b = ours(target, prompt, fresh, max_new_tokens=15)
            assert a.tolist() == b.tolist() == plain(target, prompt, max_new_tokens=15).tolist()
            assert _comparable(reused.last_stats) == _comparable(fresh.last_stats), (name, prompt)
            assert all(reused.last_stats is not s for s in seen)
            seen.append(reused.last_stats)
            again = ours(target, prompt, reused, max_new_tokens=15)  # the same call twice: the same
            assert again.tolist() == a.tolist() and _comparable(reused.last_stats) == _comparable(fresh.last_stats)


# -- errors -----------------------------------------------------------------------------------------


def test_argument_errors():
    target = tm.llama_target()
    d, v = tm.truncated_copy(target), tm.noisy_copy(target)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="max_window must be >= 1"):
            DynamicWindowAssistant(d, settings=DynamicWindowSettings(max_window=bad))
    for bad in (2.5, True, "4"):
        with pytest.raises(TypeError, match="max_window must be an int"):
            DynamicWindowAssistant(d, settings=DynamicWindowSettings(max_window=bad))
    for kw in ({"tau_init": -1.0}, {"tau2_init": -0.5}, {"tau_init": float("nan")}):
        with pytest.raises(ValueError, match="must be >= 0"):
            DynamicWindowAssistant(d, v, settings=DynamicWindowSettings(**kw))
    with pytest.raises(TypeError, match="tau_init must be a number"):
        DynamicWindowAssistant(d, settings=DynamicWindowSettings(tau_init="0"))
    with pytest.raises(ValueError, match="different .*stronger"):
        DynamicWindowAssistant(d, d)
    with pytest.raises(TypeError, match="draft_model must be a transformers causal LM"):
        DynamicWindowAssistant(MaxGram())
    with pytest.raises(TypeError, match="verifier_model must be a transformers causal LM"):
        DynamicWindowAssistant(d, 42)
    with pytest.raises(ValueError, match="only applies with a verifier_model"):
        DynamicWindowAssistant(d, settings=DynamicWindowSettings(max_target_window=20))
    with pytest.raises(ValueError, match="max_target_window must be >= 1"):
        DynamicWindowAssistant(d, v, settings=DynamicWindowSettings(max_target_window=0))


def test_generate_time_errors():
    target = tm.llama_target()
    d = tm.truncated_copy(target)
    gen = dict(max_new_tokens=4, do_sample=False)
    with pytest.raises(ValueError, match="Vocabulary mismatch"):
        target.generate(
            REPETITIVE, assistant_model=DynamicWindowAssistant(tm.llama(vocab_size=tm.VOCAB + 1025, seed=3)), **gen
        )
    with pytest.raises(ValueError, match="Vocabulary mismatch"):
        target.generate(
            REPETITIVE, assistant_model=DynamicWindowAssistant(d, tm.llama(vocab_size=tm.VOCAB + 1025)), **gen
        )
    with pytest.raises(ValueError, match="eos_token_id"):
        target.generate(REPETITIVE, assistant_model=DynamicWindowAssistant(d, tm.llama(eos_token_id=3, seed=3)), **gen)
    with pytest.raises(ValueError, match="own draft model"):
        target.generate(REPETITIVE, assistant_model=DynamicWindowAssistant(target), **gen)
    with pytest.raises(ValueError, match="left padding"):  # right padding is refused
        target.generate(
            REPETITIVE.repeat(2, 1),
            attention_mask=torch.tensor([[1] * 9, [1] * 8 + [0]]),
            assistant_model=DynamicWindowAssistant(d),
            **gen,
        )
