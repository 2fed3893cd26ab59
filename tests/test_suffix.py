"""SuffixDecoding (``hf_cascade.suffix``, the ``suffix`` / ``suffix-tree`` bench baselines).

Checked as the contract checks our strategies (tests/test_contract.py): greedy parity with plain
``generate`` on the contract's target settings, exact sampling, no state leak (exactly, with the global
cache off; with it on, the cached responses are the only state and :meth:`clear` forgets them). Also:
the cache grows across calls, requests are stopped after exceptions and in transformers' loop, trees
branch, the bench forgets the warm-up's response, and a clear message when ArcticInference is missing.
Tests that need the package ask for the ``arctic`` fixture (skipped without it).
"""

from __future__ import annotations

import copy
import functools
import sys
import time

import pytest
import torch

import hf_cascade  # noqa: F401  (installs the generate() hook)
from hf_cascade.bench.build import build_method
from hf_cascade.bench.methods import MethodUnavailable
from tests import tiny_models as tm
from tests.contract_registry import offloaded, with_attention
from tests.test_contract import (
    ASCENDING,
    REPETITIVE,
    FakeClock,
    assert_exact_sampling,
    assert_greedy_parity,
    assert_no_state_leak,
    greedy_cases,
)
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

#: prompts whose suffix "5 6" was followed by different tokens: the speculation trees branch
BRANCHING = ids(1, 20, 5, 6, 7, 8, 21, 5, 6, 9, 10, 22, 5, 6, 7, 8, 23, 5, 6)


@pytest.fixture
def arctic():
    return pytest.importorskip("arctic_inference.suffix_decoding", reason="pip install arctic-inference")


def suffix(**kwargs):
    from hf_cascade.suffix import SuffixAssistant, SuffixSettings

    return SuffixAssistant(settings=SuffixSettings(**kwargs))


MODES = {"linear": {}, "tree": {"use_tree_spec": True, "max_spec_factor": 2.0}}

SETTINGS = {
    "llama-sdpa": lambda: with_attention(tm.llama_target(), "sdpa"),
    "gemma3-eager": lambda: with_attention(tm.gemma3_target(), "eager"),
    "gemma3-bf16": lambda: copy.deepcopy(tm.gemma3_target()).to(torch.bfloat16),
    "gemma3-offload": lambda: offloaded(tm.gemma3_target()),
}
_CASES: dict = {}


def setting(name: str):
    if name not in _CASES:
        target = SETTINGS[name]()
        _CASES[name] = target, greedy_cases(target)
    return _CASES[name]


def small_target():
    """The contract's 16-token-vocabulary target for the sampling tests."""
    target = tm.llama(vocab_size=16, layers=1, hidden=16, seed=3)
    target.generation_config.eos_token_id = None
    return target


# -- the package ------------------------------------------------------------------------------------------


def test_missing_package_names_the_pip_command(monkeypatch):
    for name in ("arctic_inference", "arctic_inference.suffix_decoding"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    with pytest.raises(ImportError, match="pip install arctic-inference"):
        suffix()
    for name in ("suffix", "suffix-tree"):
        with pytest.raises(MethodUnavailable, match="pip install arctic-inference"):
            build_method(name, None, [], strategy_kwargs={}, sampling=False)


# -- the contract -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(SETTINGS))
def test_greedy_parity(arctic, name, mode):
    target, cases = setting(name)
    assistant = suffix(**MODES[mode])  # one assistant: its cache grows over the cases
    assert_greedy_parity(target, assistant, cases)
    assert list(assistant.cache.active_requests) == []
    assert len(assistant.cache.cached_requests) == len(cases)


@pytest.mark.parametrize("mode", list(MODES))
def test_exact_sampling(arctic, mode, monkeypatch):
    monkeypatch.setattr(time, "perf_counter", FakeClock())
    assert_exact_sampling(small_target(), lambda: suffix(**MODES[mode]))


@pytest.mark.parametrize("mode", list(MODES))
def test_no_state_leak_without_global_cache(arctic, mode, monkeypatch):
    """``max_cached_requests=0`` (no global tree): the contract's no-state-leak check, exactly."""
    monkeypatch.setattr(time, "perf_counter", FakeClock())
    make = functools.partial(suffix, max_cached_requests=0, **MODES[mode])
    assert_no_state_leak(tm.gemma3_target(), make, REPETITIVE, ASCENDING, do_sample=False, new=12)
    assert_no_state_leak(small_target(), make, ids(1, 5, 6, 5, 6, 5), ids(1, 9, 12), do_sample=True)


# -- the global cache of earlier responses --------------------------------------------------------------------


def test_cache_grows_across_calls_and_is_the_only_state(arctic):
    target = tm.gemma3_target()
    plain = target.generate(REPETITIVE, do_sample=False, max_new_tokens=40).tolist()
    a = suffix()
    runs = []
    for _ in range(2):
        out = target.generate(REPETITIVE, do_sample=False, max_new_tokens=40, assistant_model=a)
        assert out.tolist() == plain
        runs.append(a.last_stats.to_dict())
        assert list(a.cache.active_requests) == []  # the request stopped, its prompt tree dropped
    assert sorted(a.cache.cached_requests) == [0, 1]  # each call a new request, its response cached
    assert runs[1]["target_calls"] < runs[0]["target_calls"]  # the first response drafts the second
    assert runs[0]["levels"][0]["name"] == "suffix" and runs[0]["levels"][0]["tokens_accepted"] > 0
    a.clear()  # without the cached responses: a fresh assistant
    target.generate(REPETITIVE, do_sample=False, max_new_tokens=40, assistant_model=a)
    fresh = suffix()
    target.generate(REPETITIVE, do_sample=False, max_new_tokens=40, assistant_model=fresh)
    assert a.last_stats.accepted_per_call == fresh.last_stats.accepted_per_call == runs[0]["accepted_per_call"]


def test_request_stopped_after_an_exception(arctic, monkeypatch):
    from hf_cascade.core import loop

    target = tm.gemma3_target()
    a = suffix()
    honest, calls = loop.verify, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return honest(*args, **kwargs)

    monkeypatch.setattr(loop, "verify", failing)
    with pytest.raises(RuntimeError, match="boom"):
        target.generate(REPETITIVE, do_sample=False, max_new_tokens=20, assistant_model=a)
    assert list(a.cache.active_requests) == []
    monkeypatch.setattr(loop, "verify", honest)
    plain = target.generate(REPETITIVE, do_sample=False, max_new_tokens=20)
    assert target.generate(REPETITIVE, do_sample=False, max_new_tokens=20, assistant_model=a).tolist() == plain.tolist()


def test_transformers_loop(arctic):
    target = tm.gemma3_target()
    a = suffix()
    a.loop = "transformers"
    for prompt in (REPETITIVE, ASCENDING):
        plain = target.generate(prompt, do_sample=False, max_new_tokens=20)
        assert target.generate(prompt, do_sample=False, max_new_tokens=20, assistant_model=a).tolist() == plain.tolist()
        assert list(a.cache.active_requests) == []
    assert len(a.cache.cached_requests) == 2
    with pytest.raises(RuntimeError, match="decoding core"):
        t = suffix(use_tree_spec=True)
        t.loop = "transformers"
        target.generate(REPETITIVE, do_sample=False, max_new_tokens=5, assistant_model=t)


def test_trees_branch(arctic):
    target = tm.llama_target()
    plain = target.generate(BRANCHING, do_sample=False, max_new_tokens=20)
    a = suffix(**MODES["tree"])
    assert target.generate(BRANCHING, do_sample=False, max_new_tokens=20, assistant_model=a).tolist() == plain.tolist()
    assert max(a.last_stats.tree_leaves) > 1


# -- the bench baseline -----------------------------------------------------------------------------------


def test_bench_method_forgets_the_warmup(arctic):
    target = tm.gemma3_target()
    method = build_method("suffix", target, [], strategy_kwargs={}, sampling=False)
    out, stats = method.run(REPETITIVE, torch.ones_like(REPETITIVE), {"max_new_tokens": 8, "do_sample": False})
    assert stats["target_calls"] > 0 and stats["new_tokens"] == out.shape[1] - REPETITIVE.shape[1]
    assert len(method.assistant.cache.cached_requests) == 1
    method.after_warmup()
    assert len(method.assistant.cache.cached_requests) == 0
    assert build_method("suffix-tree", target, [], strategy_kwargs={}, sampling=False).assistant.trees


def test_bench_runs_the_suffix_baselines(arctic):
    from hf_cascade.bench import BenchConfig, run_benchmark

    prompts = [
        {"category": "a", "input_ids": REPETITIVE[0].tolist()},
        {"category": "b", "input_ids": ASCENDING[0].tolist()},
    ]
    config = BenchConfig(strategy="maxgram", baselines=["suffix", "suffix-tree"], max_new_tokens=12, warmup_tokens=2)
    result = run_benchmark(config, tm.gemma3_target(), tm.word_tokenizer(), prompts)
    assert result.errors == {}
    records = [r for r in result.records if r["method"].startswith("suffix")]
    assert len(records) == 4
    assert all(r["identical_to_plain"] and r["stats"]["new_tokens"] == 12 for r in records)


@pytest.mark.real_model
def test_greedy_parity_with_gemma(arctic, gemma):
    model, tok = gemma
    ids_ = tok("Question: Write a short poem about the sea.\n\nAnswer:", return_tensors="pt").input_ids
    plain = model.generate(ids_, do_sample=False, max_new_tokens=24).tolist()
    a, calls = suffix(), []
    for _ in range(2):  # the second call drafts from the first response
        assert model.generate(ids_, do_sample=False, max_new_tokens=24, assistant_model=a).tolist() == plain
        calls.append(a.last_stats.target_calls)
    assert calls[1] < calls[0] <= 24, calls
    tree = suffix(**MODES["tree"])
    assert model.generate(ids_, do_sample=False, max_new_tokens=24, assistant_model=tree).tolist() == plain
