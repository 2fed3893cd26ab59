"""Sampling with hf_cascade assistants follows the target's distribution exactly (lossless), and the
statistical tests used here do detect a drafter that lies about its ``q``.

Two kinds of test, both with fixed seeds (deterministic):

* per-step calibration: over long generations, for every emitted token ``x_t`` the target's exact
  processed distribution ``p_t`` given the actual prefix is computed with one forward; under
  losslessness token counts ``O_v`` and ``E_v = sum_t p_t(v)`` differ by a martingale, so
  ``sum_v (O_v - E_v)^2 / E_v`` is (at most) chi-square distributed; indicators "``x_t`` is what
  Max-Gram would copy" / "``x_t`` is the drafter's argmax" give z-scores the same way;
* the joint distribution of the first two generated tokens over many short ``generate()`` calls
  against the exact one enumerated from target forwards.

The configurations of the contract registry (Max-Gram alone, drafter + Max-Gram, lenience, Max-Gram first +
cost-aware) are checked by both kinds of test in tests/test_contract.py; here: the cascade's other
configurations, the detection of a lying ``q``, top-k in the joint test, and the lossy target rules.
"""

from __future__ import annotations

import pytest
import torch

from hf_cascade import (
    CascadeAssistant,
    CascadeSettings,
    CorpusNGrams,
    LossyLenientTarget,
    LossyTypicalAcceptance,
    MaxGram,
    Policy,
)
from hf_cascade.candidate import ChainDrafter
from tests import tiny_models as tm
from tests.sampling_stats import calibration, passes, pooled_chi2, processed_probs  # noqa: F401  (re-exported to other tests)
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

V = 16
PROMPT = ids(1, 5, 6, 5, 6, 5)


@pytest.fixture(scope="module")
def small():
    target = tm.llama(vocab_size=V, layers=1, hidden=16, seed=3)
    target.generation_config.eos_token_id = None  # no early stops: every run has the same length
    return {
        "target": target,
        "noisy": tm.noisy_copy(target, noise=0.6, seed=2),
        "noisy2": tm.noisy_copy(target, noise=0.3, seed=4),
    }


def run_long(model, assistant, calls, new, seed, **kw):
    out = []
    for c in range(calls):
        torch.manual_seed(seed + c)
        out.append(model.generate(PROMPT, do_sample=True, max_new_tokens=new, assistant_model=assistant, **kw)[0])
    return out


# corpus n-grams over V = 16 (hand sequences: what the corpus proposes is often not what the target samples)
CORPUS = CorpusNGrams.fit(
    [([1, 5, 6, 5, 6, 5, 7, 8, 9, 5, 6, 7], 1), ([3, 4, 5, 6, 7, 8], 1)], vocab_size=V, max_n=2, min_count=1
)

#: The paper's cascade (fixed K-matrix lengths, largest drafter first): the configurations below exercise each
#: review and verification path at every step; the defaults (``maxgram_first``, ``cost_aware``) are their own entry.

CONFIGS = {
    "maxgram": (lambda s: CascadeAssistant([MaxGram(adaptive=False, max_tokens=3)]), None, {}),
    "maxgram_corpus": (
        lambda s: CascadeAssistant(
            [MaxGram(adaptive=False, max_tokens=3, corpus=CORPUS, corpus_below=99)], policy=Policy.paper()
        ),
        None,
        {},
    ),
    "drafter+maxgram_l2": (
        lambda s: CascadeAssistant(
            [s["noisy"], MaxGram(adaptive=False, max_tokens=3)],
            settings=CascadeSettings(lenience=2.0),
            policy=Policy.paper(),
        ),
        "noisy",
        {},
    ),
    "drafter+maxgram_l2_temp_topk": (
        lambda s: CascadeAssistant(
            [s["noisy"], MaxGram(adaptive=False, max_tokens=3)],
            settings=CascadeSettings(lenience=2.0),
            policy=Policy.paper(),
        ),
        "noisy",
        {"temperature": 1.5, "top_k": 6},
    ),
    "maxgram_lenient_conf": (
        lambda s: CascadeAssistant(
            [s["noisy"], MaxGram(adaptive=False, max_tokens=3)],
            settings=CascadeSettings(k_matrix=[[3, 3], [0, 3]], maxgram_lenience=3.0, min_confidence=0.5),
            policy=Policy.paper(),
        ),
        "noisy",
        {},
    ),
    "maxgram_first": (
        lambda s: CascadeAssistant(
            [s["noisy"], MaxGram(adaptive=False, max_tokens=3)],
            settings=CascadeSettings(k_matrix=[[2, 3], [0, 3]], min_confidence=0.3),
        ),
        "noisy",
        {},
    ),
    "maxgram_first_drop_unsure": (
        lambda s: CascadeAssistant(
            [s["noisy"], MaxGram(adaptive=False, max_tokens=3)],
            settings=CascadeSettings(k_matrix=[[2, 3], [0, 3]], min_confidence=0.3, keep_unsure=False),
        ),
        "noisy",
        {},
    ),
    "maxgram_first_cost_aware": (
        lambda s: CascadeAssistant(
            [s["noisy"], MaxGram(adaptive=False, max_tokens=3)], settings=CascadeSettings(k_matrix=[[3, 3], [0, 3]])
        ),
        "noisy",
        {},
    ),
    "maxgram_unreviewed": (
        lambda s: CascadeAssistant(
            [s["noisy"], MaxGram(adaptive=False, max_tokens=3)],
            settings=CascadeSettings(maxgram_lenience=float("inf")),
            policy=Policy.paper(),
        ),
        "noisy",
        {},
    ),
    "drafter_alone": (
        lambda s: CascadeAssistant([s["noisy"]], settings=CascadeSettings(k_matrix=[[3]]), policy=Policy.paper()),
        "noisy",
        {"temperature": 0.8},
    ),
    "two_drafters_l3": (
        lambda s: CascadeAssistant(
            [s["noisy2"], s["noisy"], MaxGram(adaptive=False, max_tokens=3)],
            settings=CascadeSettings(lenience=3.0),
            policy=Policy.paper(),
        ),
        "noisy",
        {},
    ),
}


def _calibrate(small, name, calls=8, new=100, seed=0):
    make, drafter, kw = CONFIGS[name]
    assistant = make(small)
    seqs = run_long(small["target"], assistant, calls, new, seed, **kw)
    stats = calibration(
        small["target"],
        small[drafter] if drafter else None,
        seqs,
        PROMPT.shape[1],
        kw.get("temperature", 1.0),
        kw.get("top_k"),
    )
    return stats, assistant


# checked by tests/test_contract.py (the contract's Max-Gram, drafter + Max-Gram, lenience and cost-aware entries)
IN_CONTRACT = {"maxgram", "drafter+maxgram_l2", "drafter+maxgram_l2_temp_topk", "maxgram_first_cost_aware"}


@pytest.mark.parametrize("name", [c for c in CONFIGS if c not in IN_CONTRACT])
def test_per_step_calibration(small, name):
    stats, assistant = _calibrate(small, name)
    assert stats["n"] == 8 * 100
    assert passes(stats), stats
    # speculation actually happened, with rejections
    st = assistant.last_stats
    assert sum(st.accepted_per_call) > 0 and sum(st.accepted_per_call) < sum(st.draft_len_per_call)


def _lying_q(monkeypatch, how):
    """Make the linear drafter hand verification a wrong ``q`` (the drafts stay the same)."""
    original = ChainDrafter.draft_tree

    def draft_tree(self, seq, state):
        tree, q = original(self, seq, state)
        if q is not None:
            q = torch.full_like(q, 1.0 / q.shape[-1]) if how == "uniform" else 0.5 * q + 0.5 / q.shape[-1]
        return tree, q

    monkeypatch.setattr(ChainDrafter, "draft_tree", draft_tree)


@pytest.mark.parametrize(
    "name, how",
    [
        ("maxgram", "uniform"),
        ("maxgram", "flattened"),
        ("drafter+maxgram_l2", "uniform"),
        ("drafter_alone", "flattened"),
    ],
)
def test_per_step_calibration_detects_a_wrong_q(small, monkeypatch, name, how):
    _lying_q(monkeypatch, how)
    stats, _ = _calibrate(small, name)
    assert not passes(stats), stats


# -- the joint distribution of the first two tokens ------------------------------------------------------


def exact_first_two(model, prompt, temperature=1.0, top_k=None):
    with torch.no_grad():
        p1 = processed_probs(model(prompt).logits[0, -1:], temperature, top_k)[0]
        batch = torch.cat([prompt.repeat(V, 1), torch.arange(V)[:, None]], dim=1)
        p2 = processed_probs(model(batch).logits[:, -1], temperature, top_k)  # [V, V]
    return p1[:, None] * p2


def joint_test(model, assistant, runs, seed, **kw):
    counts = torch.zeros(V, V)
    for r in range(runs):
        torch.manual_seed(seed + r)
        out = model.generate(PROMPT, do_sample=True, max_new_tokens=2, assistant_model=assistant, **kw)[0]
        counts[int(out[-2]), int(out[-1])] += 1
    exact = exact_first_two(model, PROMPT, kw.get("temperature", 1.0), kw.get("top_k")).flatten()
    chi2, limit = pooled_chi2(counts.flatten(), exact * runs)
    return chi2, limit, 0.5 * float((counts.flatten() / runs - exact).abs().sum())


def test_first_two_tokens_joint_distribution_maxgram_topk(small):
    assistant = CascadeAssistant([MaxGram(adaptive=False, max_tokens=3)])
    chi2, limit, tv = joint_test(small["target"], assistant, runs=600, seed=300, temperature=1.5, top_k=6)
    assert chi2 < limit, (chi2, limit, tv)


# -- lossy target rules ----------------------------------------------------------------------------------


def _greedy(model, prompt, assistant=None, processors=None, new=30):
    kw = {"assistant_model": assistant} if assistant is not None else {}
    if processors:
        kw["logits_processor"] = processors
    return model.generate(prompt, do_sample=False, max_new_tokens=new, **kw)


@pytest.mark.parametrize(
    "rule", [lambda: LossyLenientTarget(1e9), lambda: LossyTypicalAcceptance(epsilon=0.0)], ids=["lenient", "typical"]
)
def test_lossy_rules_accept_every_draft(rule):
    target = tm.llama_target()
    drafter = tm.noisy_copy(target, noise=0.3)
    prompt = ids(1, 5, 6, 7, 5, 6, 7, 5, 6)
    plain = _greedy(target, prompt)
    strict = CascadeAssistant([drafter], settings=CascadeSettings(k_matrix=[[3]]), policy=Policy.paper())
    assert _greedy(target, prompt, strict).tolist() == plain.tolist()
    lossy = CascadeAssistant([drafter], settings=CascadeSettings(k_matrix=[[3]]), policy=Policy.paper())
    out = _greedy(target, prompt, lossy, [rule()])
    st = lossy.last_stats
    assert st.accepted_per_call == st.draft_len_per_call  # the target accepts every draft
    assert st.tokens_per_target_call > strict.last_stats.tokens_per_target_call
    assert st.tokens_per_target_call > 3.5 or st.target_calls <= 8
    assert out.shape == plain.shape and out.tolist() != plain.tolist()  # lossy: the output changed


@pytest.mark.parametrize(
    "rule", [lambda: LossyLenientTarget(4.0), lambda: LossyTypicalAcceptance()], ids=["lenient", "typical"]
)
def test_lossy_rules_change_nothing_with_drafter_equal_to_target(rule):
    target = tm.gemma3_target()
    prompt = ids(1, 5, 6, 7, 5, 6, 7, 5, 6)
    plain = _greedy(target, prompt)
    a = CascadeAssistant([tm.copy_model(target)], settings=CascadeSettings(k_matrix=[[3]]), policy=Policy.paper())
    assert _greedy(target, prompt, a, [rule()]).tolist() == plain.tolist()
    # without an assistant the rules see no draft and do nothing either
    assert _greedy(target, prompt, None, [rule()]).tolist() == plain.tolist()


def test_lossy_rule_under_sampling_accepts_every_draft(small):
    a = CascadeAssistant([small["noisy"]], settings=CascadeSettings(k_matrix=[[3]]), policy=Policy.paper())
    torch.manual_seed(0)
    out = small["target"].generate(
        PROMPT, do_sample=True, max_new_tokens=30, assistant_model=a, logits_processor=[LossyLenientTarget(1e9)]
    )
    st = a.last_stats
    assert out.shape[1] == PROMPT.shape[1] + 30
    assert st.accepted_per_call[:-1] == st.draft_len_per_call[:-1]
    assert st.tokens_per_target_call > 3.0
