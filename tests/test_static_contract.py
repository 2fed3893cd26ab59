"""The helpers of tests/static_contract.py (what tests/cuda/test_cuda_static.py runs on a GPU) on the CPU: the
settings of each mode, the judge of a divergence, parity and the second compiled pass on tiny targets in fp32 and
bf16. The static path's own CPU contract is tests/test_static.py."""

from __future__ import annotations

import time

import pytest
import torch
from transformers import StaticCache

import hf_cascade  # noqa: F401  (installs the generate() hook)
from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.core import compiled
from hf_cascade.core.static import static_rollback_supported
from tests.contract_registry import REGISTRY, base_kit, detached_copy, fresh_kit, setting_target
from tests.static_contract import (
    CACHE_LEN,
    PAD,
    THREE,
    check_every_strategy,
    check_second_pass,
    check_static_batch_parity,
    check_static_parity,
    default_recompile_limit,
    judge,
    left_padded,
    static_batch_cases,
    static_cases,
    static_settings,
    strict_recompiles,
    target_settings,
)
from tests.test_batch import registry_assistant
from tests.test_batch_sampling import assert_exact_batch_sampling
from tests.test_contract import REPETITIVE, FakeClock
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.skipif(not static_rollback_supported(), reason="static caches need transformers >= 5")


def test_settings_of_each_mode():
    assert static_settings("eager", "cuda") == {
        "cache_implementation": "static",
        "disable_compile": True,
        "max_cache_len": CACHE_LEN,
    }
    assert "max_cache_len" not in static_settings("compiled", "cpu", max_cache_len=None)
    gpu = static_settings("compiled", torch.device("cuda", 0))["compile_config"]
    assert (gpu.backend, gpu.mode, gpu._compile_all_devices) == ("inductor", "reduce-overhead", None)
    cpu = static_settings("compiled", "cpu")["compile_config"]
    assert (cpu.backend, cpu.mode, cpu._compile_all_devices) == ("aot_eager", None, True)
    with pytest.raises(ValueError, match="unknown mode"):
        static_settings("jit", "cpu")


def test_judge_of_a_divergence():
    target = setting_target("gemma3-bf16")
    plain = target.generate(REPETITIVE, do_sample=False, max_new_tokens=8)[0].tolist()
    assert judge(target, plain, plain, exact=True, label="same") is None
    p = REPETITIVE.shape[1] + 2
    with torch.no_grad():
        logits = target(input_ids=torch.tensor([plain[:p]])).logits[0, -1].float()
    worst = plain[:p] + [int(logits.argmin())]
    with pytest.raises(AssertionError, match="not a tie.*top-1 - top-2 logit"):
        judge(target, plain, worst, exact=False, label="argmin")
    with pytest.raises(AssertionError, match="float32 outputs must be identical"):
        judge(target, plain, worst, exact=True, label="argmin")


def test_static_parity_fp32(free_drafts):
    """fp32, eager (compiled: the tests below): identical outputs, the settings in every case."""
    target = setting_target("gemma3-sdpa")
    cases = static_cases(target, target_settings("eager", target))
    assert all(kw["cache_implementation"] == "static" for _, _, kw, _ in cases)
    for name in ("maxgram", "glide_cape"):  # a chain and a tree
        assert check_static_parity(target, REGISTRY[name](fresh_kit("gemma3", target)), cases, exact=True) == []


def test_second_compiled_pass_bf16(free_drafts):
    """bf16, compiled: parity up to ties (judged), the compiled decoder ran, a second pass compiles nothing."""
    target = detached_copy(base_kit("llama").target).to(torch.bfloat16)
    cases = static_cases(target, target_settings("compiled", target))
    check_second_pass(target, CascadeAssistant([MaxGram()]), cases, exact=False)  # ties judged, and rare


def test_redrafter_beam_search_compiles_where_verification_does(free_drafts):
    """Compiled (fp32 Llama): ReDrafter's beam search runs as the head's compiled graphs (``compiled_draft``, one per
    width and length), outputs identical to plain compiled ``generate``, a second pass compiles nothing; eager, the
    search stays eager."""
    target = detached_copy(setting_target("llama-sdpa"))
    assistant = registry_assistant("redrafter", fresh_kit("llama", target))
    head = assistant.head
    compiled._DRAFTS.pop(head, None)
    assert check_static_parity(target, assistant, static_cases(target, target_settings("eager", target)), True) == []
    assert head not in compiled._DRAFTS
    with strict_recompiles(recompile_limit=4 * default_recompile_limit()):  # the module's targets share frames
        cases = static_cases(target, target_settings("compiled", target))
        assert check_second_pass(target, assistant, cases, exact=True) == []
    ((_, search),) = compiled._DRAFTS[head].values()
    assert search.seen and all(width == assistant.settings.beam_width for _, width, _ in search.seen)


@pytest.mark.parametrize("sized", [True, False], ids=["max_cache_len", "per_call_length"])
def test_one_target_every_strategy(sized, free_drafts):
    """A user's process on the CPU (tests/cuda runs it on a GPU): dynamo reset, one bf16 target, every registry
    entry compiled, twice, within dynamo's default recompile limit, nothing compiled in the second round; with one
    ``max_cache_len``, and without (calls of other lengths: the core keeps its largest cache, one shape)."""
    target = detached_copy(base_kit("gemma3").target).to(torch.bfloat16)
    makers = {name: (lambda make=make: make(fresh_kit("gemma3", target))) for name, make in REGISTRY.items()}
    settings = target_settings("compiled", target, **({} if sized else {"max_cache_len": None}))
    check_every_strategy(target, makers, settings, exact=False)  # ties judged, and rare


# -- batches ----------------------------------------------------------------------------------------------------

_BATCH_CASES: dict = {}


def batch_cases_of(setting: str, mode: str):
    """:func:`static_batch_cases` of ``setting``'s target in ``mode`` (plain batched ``generate``, same settings)."""
    if (setting, mode) not in _BATCH_CASES:
        target = setting_target(setting)
        _BATCH_CASES[(setting, mode)] = static_batch_cases(target, target_settings(mode, target))
    return _BATCH_CASES[(setting, mode)]


def test_static_batch_cases_are_meaningful():
    """The batches are ragged, their rows finish at different steps (the static batch keeps its rows: the finished
    ones are padding), and a static batch keeps plain batched ``generate``'s dynamic-cache output."""
    target = setting_target("llama-sdpa")
    cases = {case: (batch, kw, out) for case, batch, kw, out in batch_cases_of("llama-sdpa", "eager")}
    (input_ids, mask), kw, out = cases["three_rows_eos_in_draft"]
    assert len(set(mask.sum(1).tolist())) == 3
    ends = [
        len(row) - row[::-1].index(kw["eos_token_id"]) if kw["eos_token_id"] in row[input_ids.shape[1] :] else len(row)
        for row in out
    ]
    assert len(set(ends)) > 1, ends
    dynamic = {k: v for k, v in kw.items() if k not in ("cache_implementation", "disable_compile", "max_cache_len")}
    assert target.generate(input_ids, attention_mask=mask, do_sample=False, **dynamic).tolist() == out


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("name", list(REGISTRY))
def test_static_batch_parity(name, mode, free_drafts, open_gate):
    """Every registry entry on batches of 2 and 3 ragged prompts, fp32 Llama: plain batched ``generate``'s rows with
    the same static settings, eager and compiled; compiled, a second pass captures no new dynamo graph."""
    target = setting_target("llama-sdpa")
    assistant = registry_assistant(name, fresh_kit("llama", target))
    cases = batch_cases_of("llama-sdpa", mode)
    if mode == "eager":
        assert check_static_batch_parity(target, assistant, cases, exact=True) == []
    else:
        with strict_recompiles(recompile_limit=4 * default_recompile_limit()):  # the module's targets share frames
            assert check_second_pass(target, assistant, cases, exact=True, parity=check_static_batch_parity) == []


@pytest.mark.parametrize("name", ["maxgram", "glide_cape", "redrafter"])
def test_static_batch_parity_sliding_layers(name, free_drafts, open_gate):
    """Gemma3 (sliding-window layers: the static batch keeps them full and windows by the mask), eager."""
    target = setting_target("gemma3-sdpa")
    cases = batch_cases_of("gemma3-sdpa", "eager")
    assert (
        check_static_batch_parity(target, registry_assistant(name, fresh_kit("gemma3", target)), cases, exact=True)
        == []
    )


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("name", ["maxgram", "glide_cape"])
def test_static_batch_exact_sampling(name, mode, monkeypatch, free_drafts, open_gate):
    """Exact sampling per row of a static batch (tests/test_batch_sampling.py's joint law and calibration), a chain
    and a tree, eager and compiled."""
    monkeypatch.setattr(time, "perf_counter", FakeClock())
    target = detached_copy(base_kit("small").target)
    settings = static_settings(mode, "cpu")
    target.generation_config.update(**{k: v for k, v in settings.items() if k != "disable_compile"})
    target.generation_config.disable_compile = mode == "eager"
    kit = fresh_kit("small", target)
    with strict_recompiles(recompile_limit=4 * default_recompile_limit()):
        assert_exact_batch_sampling(target, lambda: registry_assistant(name, kit))
    assert (target.get_decoder() in compiled._COMPILED) == (mode == "compiled")


@pytest.mark.parametrize("setting", ["llama-sdpa", "gemma3-sdpa"])
def test_user_static_cache_batch(setting, open_gate):
    """A user's StaticCache for a batch of three ragged rows, sized to the call's length (no room beyond it: the
    batch compacts when its next block would not fit, and cuts drafts to the room left): plain batched
    ``generate``'s rows with its own StaticCache; the user's cache holds the batch's three rows."""
    target = setting_target(setting)
    input_ids, mask = left_padded(THREE, "cpu")
    new = 32
    size = input_ids.shape[1] + new
    kw = {"max_new_tokens": new, "do_sample": False, "pad_token_id": PAD, "eos_token_id": None}
    plain = target.generate(
        input_ids,
        attention_mask=mask,
        **kw,
        **{hf_cascade.compat.CACHE: StaticCache(config=target.config, max_cache_len=size)},
    )
    cache = StaticCache(config=target.config, max_cache_len=size)
    a = CascadeAssistant([MaxGram()])
    out = target.generate(input_ids, attention_mask=mask, assistant_model=a, **kw, **{hf_cascade.compat.CACHE: cache})
    assert out.tolist() == plain.tolist()
    assert all(layer.is_initialized and layer.keys.shape[:3:2] == (3, size) for layer in cache.layers)
    stats = a.last_stats
    assert stats.rows[0].target_calls < new and stats.compactions > 0, stats  # the repetitive row drafted


def test_user_compiled_forward_verifies_a_batch(open_gate):
    """A batch on a target whose forward the user compiled: verification goes through it (full logits), dynamic and
    static caches alike, and gives plain batched ``generate``'s rows."""
    target = detached_copy(setting_target("llama-sdpa"))
    input_ids, mask = left_padded(THREE, "cpu")
    kw = {"max_new_tokens": 16, "do_sample": False, "pad_token_id": PAD}
    plain = target.generate(input_ids, attention_mask=mask, **kw)
    seen = []
    original = target.forward

    def forward(*args, **kwargs):
        seen.append(tuple(kwargs["input_ids"].shape))
        return original(*args, **kwargs)

    target.forward = torch.compile(forward, backend="eager")
    for cache_implementation in (None, "static"):
        seen.clear()
        out = target.generate(
            input_ids,
            attention_mask=mask,
            cache_implementation=cache_implementation,
            assistant_model=CascadeAssistant([MaxGram()]),
            **kw,
        )
        assert out.tolist() == plain.tolist(), cache_implementation
        assert len(seen) > 2 and max(q for _, q in seen[1:]) > 1, seen  # prefill, then verifications with drafts
