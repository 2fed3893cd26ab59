"""Benchmark harness: ``--strategy hsddw`` (with and without ``--verifier``), the named assisted
baselines ``hf-assisted-constant`` / ``hf-assisted-confidence``, and the window-per-step plot.
Tiny models, tokenizer and prompts come from ``tests/test_bench.py``."""

from __future__ import annotations

import pytest
import torch

from hf_cascade.bench import BenchConfig, markdown_report, run_benchmark, write_results  # noqa: E402
from hf_cascade.bench.build import build_method  # noqa: E402
from hf_cascade.bench.peers import ASSISTED_WINDOW, assisted_settings  # noqa: E402
from hf_cascade.cli import bench_config, build_parser  # noqa: E402
from tests.test_bench import NEW_TOKENS, PROMPTS, _llama, tiny  # noqa: F401  (tiny: fixture)
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

BASELINES = ["plain", "hf-assisted", "hf-assisted-constant", "hf-assisted-confidence"]


@pytest.fixture(scope="module")
def verifier():
    return _llama(2, 2)


@pytest.mark.parametrize("with_verifier", [False, True], ids=["sd_self_verify", "hsddw"])
def test_hsddw_strategy_and_assisted_baselines(tiny, verifier, with_verifier, tmp_path):
    model, draft, tok = tiny
    config = BenchConfig(strategy="hsddw", baselines=BASELINES, max_new_tokens=NEW_TOKENS, warmup_tokens=2)
    r = run_benchmark(config, model, tok, PROMPTS, drafts=[draft], verifier=verifier if with_verifier else None)
    assert r.methods == BASELINES + ["hsddw"], r.errors
    for rec in r.records:
        assert rec["identical_to_plain"] is True, (rec["method"], rec["output_text"])
    stats = [rec["stats"] for rec in r.records if rec["method"] == "hsddw"]
    for s in stats:
        assert s["window_per_step"] == s["draft_len_per_call"] and len(s["window_per_step"]) == s["target_calls"]
        assert 0.0 <= s["redundancy"] <= 1.0 and 0.0 < s["target_utilization"] <= 1.0
        assert set(s["calls_per_model"]) == ({"target", "draft", "verifier"} if with_verifier else {"target", "draft"})
    assert ("verifier" in r.environment) == with_verifier
    paths = write_results(r, tmp_path)
    png = tmp_path / "window_per_step.png"
    assert paths["window_png"] == png and png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 1000
    assert "| hsddw |" in markdown_report(r)


@pytest.mark.parametrize("window", [ASSISTED_WINDOW, 4])
@pytest.mark.parametrize("name", ["hf-assisted-constant", "hf-assisted-confidence"])
def test_assisted_variants_set_the_draft_config_per_call_only(tiny, name, window, monkeypatch):
    model, draft, _ = tiny
    before = draft.generation_config.to_dict()
    seen = []
    original = type(model).generate

    def spy(self, *args, **kwargs):
        if "assistant_model" in kwargs:  # the target's call (not the draft's own generate inside it)
            gc = kwargs["assistant_model"].generation_config
            seen.append((gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "generate", spy)
    method = build_method(name, model, [draft], strategy_kwargs={}, sampling=False, window=window)
    method.run(
        torch.tensor([[1, 5, 6, 7]]), torch.ones(1, 4, dtype=torch.long), {"max_new_tokens": 4, "do_sample": False}
    )
    threshold = {"hf-assisted-constant": 0.0, "hf-assisted-confidence": 0.4}[name]
    assert seen == [(window, "constant", threshold)]
    assert (
        assisted_settings(name, window)["num_assistant_tokens"] == window and assisted_settings("hf-assisted") is None
    )
    assert draft.generation_config.to_dict() == before  # the shared draft model is left as it was


def test_single_and_hierarchical_in_one_run_with_a_window(tiny, verifier):
    """``hsddw-single`` (Algorithm 1) beside ``hsddw`` with a verifier (Algorithm 2); ``window`` is both max_windows."""
    model, draft, tok = tiny
    config = BenchConfig(
        strategy="hsddw", baselines=["hsddw-single"], window=3, max_new_tokens=NEW_TOKENS, warmup_tokens=2
    )
    r = run_benchmark(config, model, tok, PROMPTS[:2], drafts=[draft], verifier=verifier)
    assert r.methods == ["plain", "hsddw-single", "hsddw"], r.errors
    for rec in r.records:
        assert rec["identical_to_plain"] is True
        if rec["method"] != "plain":
            # the target's window: max_window alone, up to max_target_window = 5 * max_window with a pre-verifier
            assert max(rec["stats"]["window_per_step"]) <= (15 if rec["method"] == "hsddw" else 3)
            assert ("verifier" in rec["stats"]["calls_per_model"]) == (rec["method"] == "hsddw")
    with pytest.raises(ValueError, match="window must be >= 1"):
        BenchConfig(strategy="hsddw", window=0)


def test_hsddw_needs_a_draft(tiny):
    model, _, tok = tiny
    r = run_benchmark(
        BenchConfig(strategy="hsddw", baselines=["plain"], max_new_tokens=4, warmup_tokens=1), model, tok, PROMPTS[:1]
    )
    assert r.methods == ["plain"] and "needs a draft model" in r.errors["hsddw"]


def test_cli_and_config():
    args = build_parser().parse_args(
        [
            "bench",
            "--strategy",
            "hsddw",
            "--draft",
            "small",
            "--verifier",
            "big",
            "--baselines",
            "hf-assisted-constant,hf-assisted-confidence",
            "--window",
            "16",
        ]
    )
    config = bench_config(args)
    assert (config.strategy, config.drafts, config.verifier, config.window) == ("hsddw", ["small"], "big", 16)
    assert config.methods == ["plain", "hf-assisted-constant", "hf-assisted-confidence", "hsddw"]
    with pytest.raises(ValueError, match="only used by strategy hsddw"):
        BenchConfig(strategy="cascade", verifier="big")
    with pytest.raises(ValueError, match="not hsddw"):
        BenchConfig(strategy="hsddw", lenience=2.0)
