"""The helpers of tests/static_contract.py (what tests/cuda/test_cuda_static.py runs on a GPU) on the CPU: the
settings of each mode, the judge of a divergence, parity and the second compiled pass on tiny targets in fp32 and
bf16. The static path's own CPU contract is tests/test_static.py."""

from __future__ import annotations

import copy

import pytest
import torch

import hf_cascade  # noqa: F401  (installs the generate() hook)
from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.core.static import static_rollback_supported
from tests.contract_registry import REGISTRY, base_kit, fresh_kit, setting_target
from tests.static_contract import (CACHE_LEN, check_every_strategy, check_second_pass, check_static_parity, judge,
                                   static_cases, static_settings, target_settings)
from tests.test_contract import REPETITIVE
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.skipif(not static_rollback_supported(), reason="static caches need transformers >= 5")


def test_settings_of_each_mode():
    assert static_settings("eager", "cuda") == {"cache_implementation": "static", "disable_compile": True,
                                                "max_cache_len": CACHE_LEN}
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
    for name in ("maxgram", "glide_cape"):                          # a chain and a tree
        assert check_static_parity(target, REGISTRY[name](fresh_kit("gemma3", target)), cases, exact=True) == []


def test_second_compiled_pass_bf16(free_drafts):
    """bf16, compiled: parity up to ties (judged), the compiled decoder ran, a second pass compiles nothing."""
    target = copy.deepcopy(base_kit("llama").target).to(torch.bfloat16)
    cases = static_cases(target, target_settings("compiled", target))
    ties = check_second_pass(target, CascadeAssistant([MaxGram()]), cases, exact=False)
    assert all("first divergence" in t for t in ties)


@pytest.mark.parametrize("sized", [True, False], ids=["max_cache_len", "per_call_length"])
def test_one_target_every_strategy(sized, free_drafts):
    """A user's process on the CPU (tests/cuda runs it on a GPU): dynamo reset, one bf16 target, every registry
    entry compiled, twice, within dynamo's default recompile limit, nothing compiled in the second round; with one
    ``max_cache_len``, and without (calls of other lengths: the core keeps its largest cache, one shape)."""
    target = copy.deepcopy(base_kit("gemma3").target).to(torch.bfloat16)
    makers = {name: (lambda make=make: make(fresh_kit("gemma3", target))) for name, make in REGISTRY.items()}
    settings = target_settings("compiled", target, **({} if sized else {"max_cache_len": None}))
    ties = check_every_strategy(target, makers, settings, exact=False)
    assert all("first divergence" in t for t in ties)
