"""The contract every hf_cascade assistant keeps, checked in one place for every strategy.

:data:`REGISTRY` names every assistant in its main configurations (``name -> factory(kit) -> assistant``;
a :class:`Kit` holds the target and the drafters / heads built for it). For each entry:

(a) **greedy parity** -- token-identical to plain ``generate`` of the same model in the same dtype: a
    repetitive prompt (drafts get accepted), a 1-token prompt, an EOS inside a draft, ``max_new_tokens``
    reached inside a draft (repetitive and non-repetitive prompts), with ``repetition_penalty`` and with
    ``no_repeat_ngram_size``; on every target setting of :data:`SETTINGS`: Llama, Gemma3 (sliding-window
    layers) with eager and sdpa attention, a bf16 target whose drafters and heads are given in fp32 (the
    assistant casts them when it binds to the target), a target dispatched by accelerate with CPU offload
    (weights on ``meta`` between forwards, ``AlignDevicesHook`` s);
(b) **exact sampling** -- on a 16-token vocabulary: the joint distribution of the first three sampled tokens
    over many runs against the one enumerated from target forwards (chi-square over bins of the exact law),
    and per-step calibration of long sampled generations, with temperature, top-k, top-p and a repetition
    penalty, against the target's exact processed distributions; a negative control shows both fail for a sampler
    that lies about ``q``;
(c) **no state leak** -- a second ``generate()`` with the same assistant gives what a fresh assistant gives
    (sequences, greedy and sampled with a fixed seed, and statistics, on a deterministic clock).

Also: tree assistants (GLIDE+CAPE, ReDrafter) refuse a target configured for flash attention (a tree mask
cannot be expressed there) with a ValueError naming the attention implementation, before any forward.

The checks are functions of a target, so tests/cuda runs the same contract on a GPU (fp16/bf16,
``device_map="auto"``, drafters on another device). Each strategy's own rules (golden tensors, drafting
rules, its statistics) stay in its own test file.
"""

from __future__ import annotations

import time

import pytest
import torch

import hf_cascade  # noqa: F401  (installs the generate() hook)
from tests.contract_registry import (
    LINEAR,
    REGISTRY,
    SETTINGS,
    STATEFUL,
    TREE_ASSISTANTS,
    WITH_MODELS,  # noqa: F401
    assert_placed,
    base_kit,
    fresh_kit,
    input_device,
    models_used,
    setting_target,
    with_attention,
)
from tests.sampling_stats import calibration, chi2_isf, passes, processed_probs
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

# -- (a) greedy parity ------------------------------------------------------------------------------------

REPETITIVE = ids(1, 5, 6, 7, 5, 6, 7, 5, 6)
ASCENDING = ids(1, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39)
ONE_TOKEN = ids(9)


def _eos_inside_drafts(target) -> int:
    """A token the target emits on REPETITIVE that it emitted before (its outputs cycle, so drafts copy it):
    as EOS, generation stops inside a draft."""
    prompt = REPETITIVE.to(input_device(target))
    free = target.generate(prompt, do_sample=False, max_new_tokens=40, eos_token_id=None)[0, prompt.shape[1] :].tolist()
    return next((free[i] for i in range(4, len(free)) if free[i] in free[:i]), free[6])


def greedy_cases(target) -> list[tuple[str, torch.Tensor, dict, list]]:
    """``(case, prompt, generate kwargs, plain generate's output)`` on ``target``."""
    eos = _eos_inside_drafts(target)
    cases = [
        ("repetitive", REPETITIVE, {"max_new_tokens": 20}),
        ("one_token", ONE_TOKEN, {"max_new_tokens": 16}),
        ("eos_in_draft", REPETITIVE, {"max_new_tokens": 40, "eos_token_id": eos}),
        ("max_new_tokens_3", REPETITIVE, {"max_new_tokens": 3}),
        ("ascending_max_new_tokens_7", ASCENDING, {"max_new_tokens": 7}),
        ("repetition_penalty", REPETITIVE, {"max_new_tokens": 16, "repetition_penalty": 1.5}),
        ("no_repeat_ngram_size", REPETITIVE, {"max_new_tokens": 16, "no_repeat_ngram_size": 2}),
    ]
    device = input_device(target)
    return [
        (name, prompt.to(device), kw, target.generate(prompt.to(device), do_sample=False, **kw).tolist())
        for name, prompt, kw in cases
    ]


def assert_greedy_parity(target, assistant, cases) -> None:
    """Every case gives plain ``generate``'s tokens (the same assistant throughout), and drafts were used."""
    accepted = 0
    for case, prompt, kw, expected in cases:
        got = target.generate(prompt, do_sample=False, assistant_model=assistant, **kw)
        assert got.tolist() == expected, (case, kw)
        stats = assistant.last_stats
        assert stats.new_tokens == got.shape[1] - prompt.shape[1], case
        accepted += sum(stats.accepted_per_call)
    assert accepted > 0  # drafts were accepted


_CASES: dict = {}


def setting_cases(setting: str):
    if setting not in _CASES:
        _CASES[setting] = greedy_cases(setting_target(setting))
    return _CASES[setting]


def test_greedy_cases_are_meaningful():
    """The cases test what they say: EOS stops early, the processors change the output."""
    for setting in ("llama-sdpa", "gemma3-sdpa"):
        out = {case: expected for case, _, _, expected in setting_cases(setting)}
        assert len(out["eos_in_draft"][0]) < REPETITIVE.shape[1] + 40
        for case in ("repetition_penalty", "no_repeat_ngram_size"):
            assert out[case][0] != out["repetitive"][0][: len(out[case][0])], case


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("name", list(REGISTRY))
def test_greedy_parity(name, setting, free_drafts):
    # free_drafts: on tiny models a draft forward costs about what the target's does, so the measured-cost
    # defaults (GLIDE, ReDrafter) may rightly stop drafting; parity must be shown on drafted steps
    target = setting_target(setting)
    kit = fresh_kit(SETTINGS[setting][0], target)  # fp32 drafters and heads
    assistant = REGISTRY[name](kit)
    assert_greedy_parity(target, assistant, setting_cases(setting))
    if setting.endswith("bf16"):  # cast when the assistant bound to the target
        assert_placed(models_used(assistant, kit), torch.device("cpu"), torch.bfloat16)


# -- (c) no state leak ----------------------------------------------------------------------------------------


class FakeClock:
    """``time.perf_counter`` advancing 1 ms per call: measured "durations" (adaptive lookahead, cost-aware
    lengths) are a function of the code path, so two runs of the same call decide the same."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1e-3
        return self.now


def comparable(stats) -> dict:
    """``stats.to_dict()`` without wall times and costs (measured, not decided)."""

    def clean(x):
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if not any(s in k for s in ("second", "cost", "time"))}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x

    return clean(stats.to_dict())


def assert_no_state_leak(
    target, make_assistant, first, second, do_sample: bool, new: int = 20, stateful: bool = False
) -> None:
    """After a call on ``first``, the same assistant gives on ``second`` exactly what a fresh one gives
    (outputs with the same seed, statistics; ``stateful``: an assistant that remembers earlier calls on purpose,
    the greedy outputs only: its drafts differ, so a sampled call draws another sample of the same law, which the
    exact-sampling tests check). Needs a deterministic clock (:class:`FakeClock`). A prompt is
    ``[1, L]`` ids or a batch ``(input_ids, attention_mask or None)``."""
    device = input_device(target)

    def run(assistant, prompt):
        input_ids, mask = prompt if isinstance(prompt, tuple) else (prompt, None)
        torch.manual_seed(7)
        out = target.generate(
            input_ids.to(device),
            attention_mask=None if mask is None else mask.to(device),
            do_sample=do_sample,
            max_new_tokens=new,
            assistant_model=assistant,
        )
        return out.tolist(), comparable(assistant.last_stats)

    reused = make_assistant()
    run(reused, first)
    first_stats = reused.last_stats
    got, got_stats = run(reused, second)
    assert reused.last_stats is not first_stats
    ref, ref_stats = run(make_assistant(), second)
    assert got == ref or (stateful and do_sample)
    assert got_stats == ref_stats or stateful


@pytest.mark.parametrize("name", list(REGISTRY))
def test_no_state_leak(name, monkeypatch):
    """Greedy on Gemma3, sampled on the small target."""
    monkeypatch.setattr(time, "perf_counter", FakeClock())
    gemma = base_kit("gemma3").target
    kit = fresh_kit("gemma3", gemma)
    stateful = name in STATEFUL
    assert_no_state_leak(
        gemma, lambda: REGISTRY[name](kit), REPETITIVE, ASCENDING, do_sample=False, new=12, stateful=stateful
    )
    small = base_kit("small").target
    kit = fresh_kit("small", small)
    assert_no_state_leak(
        small, lambda: REGISTRY[name](kit), ids(1, 5, 6, 5, 6, 5), ids(1, 9, 12), do_sample=True, stateful=stateful
    )


# -- (b) exact sampling -----------------------------------------------------------------------------------------

V = 16
SPROMPT = ids(1, 5, 6, 5, 6, 5)
# the small target's own continuation repeats "1 5 6 5": Max-Gram's draft after it is likely (p(6, 5) ~ .5),
# so drafts are often accepted within the first three tokens, and a wrong q shows
JPROMPT = ids(1, 5, 6, 5, 6, 5, 1, 13, 1, 13, 1, 13, 1, 5)


def binned_chi2(observed: torch.Tensor, expected: torch.Tensor, min_expected: float = 5.0) -> tuple[float, float]:
    """Chi-square over bins of cells taken in decreasing expectation, a bin closed once it expects
    ``min_expected`` (the remainder joins the last bin): the bins depend on the exact law only, and the
    likely cells (where a wrong ``q`` moves mass) keep bins of their own. Returns ``(chi2, limit)``."""
    order = expected.argsort(descending=True)
    bins_e, bins_o, e_acc, o_acc = [], [], 0.0, 0.0
    for e, o in zip(expected[order].tolist(), observed[order].tolist()):
        e_acc, o_acc = e_acc + e, o_acc + o
        if e_acc >= min_expected:
            bins_e.append(e_acc)
            bins_o.append(o_acc)
            e_acc = o_acc = 0.0
    bins_e[-1] += e_acc
    bins_o[-1] += o_acc
    e, o = torch.tensor(bins_e), torch.tensor(bins_o)
    return float(((o - e) ** 2 / e).sum()), chi2_isf(max(len(bins_e) - 1, 1))


def exact_first_three(model, prompt, **sampling) -> torch.Tensor:
    """``[V, V, V]``: the target's exact joint distribution of the first three sampled tokens (CPU), under the
    processors ``sampling`` names (:func:`processed_probs`' keywords)."""
    device = input_device(model)
    prompt = prompt.to(device)

    def probs(ids: torch.Tensor) -> torch.Tensor:  # [N, L] -> [N, V]
        return processed_probs(model(ids).logits[:, -1], prefixes=ids.tolist(), **sampling).cpu()

    with torch.no_grad():
        p1 = probs(prompt)[0]
        one = torch.cat([prompt.repeat(V, 1), torch.arange(V, device=device)[:, None]], dim=1)  # [V, L + 1]
        p2 = probs(one)  # [V, V]
        two = torch.cat([one.repeat_interleave(V, dim=0), torch.arange(V, device=device).repeat(V)[:, None]], dim=1)
        p3 = probs(two).view(V, V, V)
    return p1[:, None, None] * p2[:, :, None] * p3


def joint_test(model, assistant, runs: int, seed: int, **sampling) -> dict:
    """The first three tokens of ``runs`` sampled generations (``sampling``: ``generate``'s processor keywords)
    against :func:`exact_first_three`."""
    prompt = JPROMPT.to(input_device(model))
    counts = torch.zeros(V, V, V)
    accepted = 0
    for r in range(runs):
        torch.manual_seed(seed + r)
        out = model.generate(prompt, do_sample=True, max_new_tokens=3, assistant_model=assistant, **sampling)[
            0, -3:
        ].tolist()
        counts[tuple(out)] += 1
        accepted += sum(assistant.last_stats.accepted_per_call)
    exact = exact_first_three(model, JPROMPT, **sampling)
    chi2, limit = binned_chi2(counts.flatten(), exact.flatten() * runs)
    tv = 0.5 * float((counts / runs - exact).abs().sum())
    return {"chi2": chi2, "limit": limit, "tv": tv, "accepted": accepted}


SAMPLING_KW = {"temperature": 1.3, "top_k": 10, "top_p": 0.95, "repetition_penalty": 1.2}
CALLS, NEW = 4, 60
JOINT_RUNS = 100


def calibrate(model, assistant, calls: int = CALLS, new: int = NEW, seed: int = 0) -> dict:
    prompt = SPROMPT.to(input_device(model))
    seqs, accepted, drafted = [], 0, 0
    for c in range(calls):
        torch.manual_seed(seed + c)
        seqs.append(
            model.generate(prompt, do_sample=True, max_new_tokens=new, assistant_model=assistant, **SAMPLING_KW)[0]
        )
        accepted += sum(assistant.last_stats.accepted_per_call)
        drafted += sum(assistant.last_stats.tree_depths)
    stats = calibration(model, None, seqs, prompt.shape[1], **SAMPLING_KW)
    stats.update(accepted=accepted, drafted=drafted)
    return stats


def assert_exact_sampling(target, make_assistant) -> None:
    """Both statistical tests pass, with drafts accepted and rejected (``target``: 16-token vocabulary): the joint
    law untouched and under :data:`SAMPLING_KW`'s processors, the calibration under those processors."""
    for sampling in ({}, SAMPLING_KW):
        joint = joint_test(target, make_assistant(), runs=JOINT_RUNS, seed=1000, **sampling)
        assert passes(joint), (sampling, joint)
        assert joint["accepted"] > 0, (sampling, joint)
    cal = calibrate(target, make_assistant())
    assert cal["n"] == CALLS * NEW and passes(cal), cal
    assert 0 < cal["accepted"] < cal["drafted"], cal


@pytest.mark.parametrize("name", list(REGISTRY))
def test_exact_sampling(name, monkeypatch):
    monkeypatch.setattr(time, "perf_counter", FakeClock())  # timed decisions: reproducible runs
    target = base_kit("small").target
    kit = fresh_kit("small", target)
    assert_exact_sampling(target, lambda: REGISTRY[name](kit))


def accelerator_schedule(monkeypatch) -> None:
    """What runs on a GPU, forced on this CPU: the drafting loops defer their reads (``placement.DEFER_READS``) and
    acceptance reads the device in as few transfers as it can (``sampling_tree_accept(batched=True)``: the two-read
    walk of chains and point-mass siblings, the device-side residuals otherwise); a CPU takes the in-turn walk."""
    from hf_cascade import placement
    from hf_cascade.core import phases

    accept = phases.sampling_tree_accept
    monkeypatch.setattr(placement, "DEFER_READS", True)
    monkeypatch.setattr(phases, "sampling_tree_accept", lambda *a, **kw: accept(*a, **{**kw, "batched": True}))


@pytest.mark.parametrize("name", list(REGISTRY))
def test_exact_sampling_on_the_accelerator_schedule(name, monkeypatch):
    monkeypatch.setattr(time, "perf_counter", FakeClock())
    accelerator_schedule(monkeypatch)
    target = base_kit("small").target
    kit = fresh_kit("small", target)
    assert_exact_sampling(target, lambda: REGISTRY[name](kit))


def lie_about_q(monkeypatch):
    """A broken sampler: the core's acceptance (both loops': :mod:`hf_cascade.core.phases`) is told every draft was
    drawn from a uniform ``q``."""
    from hf_cascade.core import phases

    honest = phases.sampling_tree_accept

    def lying(tree, target_probs, draft_probs=None, generator=None, **kwargs):
        return honest(tree, target_probs, torch.full((tree.num_nodes, V), 1.0 / V), generator, **kwargs)

    monkeypatch.setattr(phases, "sampling_tree_accept", lying)


@pytest.mark.parametrize("name", ["maxgram", "maxgram_tree", "recycling"])
def test_exact_sampling_detects_a_wrong_q(name, monkeypatch):
    """Negative control: the same two tests, same runs and seeds, fail for a sampler that lies about ``q``."""
    lie_about_q(monkeypatch)
    monkeypatch.setattr(time, "perf_counter", FakeClock())
    target = base_kit("small").target
    kit = fresh_kit("small", target)
    joint = joint_test(target, REGISTRY[name](kit), runs=JOINT_RUNS, seed=1000)
    assert not passes(joint), joint
    cal = calibrate(target, REGISTRY[name](kit))
    assert not passes(cal), cal


# -- (d) transformers' own assisted loop ------------------------------------------------------------------------
# The linear strategies are transformers ``CandidateGenerator`` s: with ``loop = "transformers"`` they run inside
# ``GenerationMixin._assisted_decoding`` of the installed release (its verification, acceptance and cache crop),
# which changes from release to release (5.25 reads ``num_drafting_tokens``). The same greedy parity and exact
# sampling hold there.


def in_transformers_loop(make_assistant):
    """``make_assistant`` with ``loop = "transformers"``, whose generators are checked to propose no draft longer
    than the ``num_drafting_tokens`` they declare (transformers >= 5.25 sizes a linear-attention cache's recorded
    states by it)."""

    def make():
        assistant = make_assistant()
        assistant.loop = "transformers"
        build = assistant.build

        def checked_build(*args, **kwargs):
            generator = build(*args, **kwargs)
            get_candidates = generator.get_candidates

            def bounded(input_ids, **kw):
                candidates, logits = get_candidates(input_ids, **kw)
                assert candidates.shape[1] - input_ids.shape[1] <= generator.num_drafting_tokens
                return candidates, logits

            generator.get_candidates = bounded
            return generator

        assistant.build = checked_build
        return assistant

    return make


@pytest.mark.parametrize("name", list(REGISTRY))
def test_linear_registry_entries(name):
    """:data:`LINEAR` names exactly the registry's linear assistants."""
    from hf_cascade.assistant import LinearAssistant

    assistant = REGISTRY[name](fresh_kit("small", base_kit("small").target))
    assert (isinstance(assistant, LinearAssistant) and not assistant.trees) == (name in LINEAR)


@pytest.mark.parametrize("setting", ["llama-sdpa", "gemma3-sdpa"])
@pytest.mark.parametrize("name", LINEAR)
def test_transformers_loop_greedy_parity(name, setting, free_drafts):
    target = setting_target(setting)
    kit = fresh_kit(SETTINGS[setting][0], target)
    assistant = in_transformers_loop(lambda: REGISTRY[name](kit))()
    assert_greedy_parity(target, assistant, setting_cases(setting))
    assert assistant.last_stats.prefill_calls == 0  # transformers' loop ran, not the core's


@pytest.mark.parametrize("name", LINEAR)
def test_transformers_loop_exact_sampling(name, monkeypatch):
    monkeypatch.setattr(time, "perf_counter", FakeClock())
    target = base_kit("small").target
    kit = fresh_kit("small", target)
    assert_exact_sampling(target, in_transformers_loop(lambda: REGISTRY[name](kit)))


# -- flash attention: a clear error before any forward ---------------------------------------------------------


@pytest.mark.parametrize("name", TREE_ASSISTANTS)
def test_tree_assistant_refuses_flash_attention(name):
    target = with_attention(base_kit("gemma3").target, "eager")
    target.config._attn_implementation = "flash_attention_2"  # flash-attn itself is not installed here
    assistant = REGISTRY[name](fresh_kit("gemma3", target))
    forwards = []
    handle = target.register_forward_pre_hook(lambda *a: forwards.append(1))
    try:
        with pytest.raises(ValueError, match="flash_attention_2") as err:
            target.generate(REPETITIVE, do_sample=False, max_new_tokens=5, assistant_model=assistant)
    finally:
        handle.remove()
    assert "attention" in str(err.value).lower() or "attn" in str(err.value).lower()
    assert forwards == []
