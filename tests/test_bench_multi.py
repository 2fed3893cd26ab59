"""Benchmark harness: several strategies in one interleaved run (``--strategy maxgram,cascade`` / ``all``),
per-strategy draft models (``--draft glide=PATH``, the shipped heads on the default target), assistants
built with their library defaults when no option is given, and the summary / report / plot against
plain-kernels. Tiny models, tokenizer and prompts come from ``tests/test_bench.py``."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from hf_cascade import CascadeSettings, DynamicWindowSettings, GlideSettings, Policy, ReDrafterSettings
from hf_cascade.bench import BenchConfig, BenchResult, loading, markdown_report, run_benchmark, write_results  # noqa: E402
from hf_cascade.bench import build as bench_methods  # noqa: E402
from hf_cascade.bench.config import STRATEGIES, parse_drafts, parse_strategies  # noqa: E402
from hf_cascade.bench.report import below_kernels, markdown_kernels  # noqa: E402
from hf_cascade.bench.runner import _build_methods  # noqa: E402
from hf_cascade.bench.summary import paired_names, summarize  # noqa: E402
from hf_cascade.cli import bench_config, build_parser, main  # noqa: E402
from tests.test_bench import NEW_TOKENS, PROMPTS, tiny  # noqa: F401  (tiny: fixture)
from tests.test_glide_decode import echo_glide
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)


def _config(*argv: str) -> BenchConfig:
    return bench_config(build_parser().parse_args(["bench", *argv]))


# -- parsing ---------------------------------------------------------------------------------------


def test_strategy_lists():
    assert parse_strategies("maxgram") == ["maxgram"]
    assert parse_strategies(" glide, maxgram ,glide") == ["glide", "maxgram"]  # order kept, once each
    assert parse_strategies("all") == list(STRATEGIES) == parse_strategies(["all", "cascade"])
    for bad in ("nope", "maxgram,nope", ""):
        with pytest.raises(ValueError, match="strategy"):
            parse_strategies(bad)
    config = BenchConfig(strategy=["maxgram", "cascade"], baselines=["plain-kernels", "maxgram", "pld"])
    # a baseline that is also a strategy of the run is measured once, as the strategy
    assert config.methods == ["plain", "plain-kernels", "pld", "maxgram", "cascade"]
    assert (config.strategy, config.strategies) == ("maxgram,cascade", ["maxgram", "cascade"])
    assert config.to_dict()["strategy"] == "maxgram,cascade" and config.to_dict()["strategies"] == [
        "maxgram",
        "cascade",
    ]
    assert BenchConfig(strategy="glide").strategy == "glide"  # one strategy: as before


def test_cli_all_with_nothing_else():
    """``--strategy all --baselines plain-kernels,maxgram`` is the whole command on the default target."""
    config = _config("--strategy", "all", "--baselines", "plain-kernels,maxgram")
    assert config.methods == [
        "plain",
        "plain-kernels",
        "maxgram",
        "cascade",
        "hsddw",
        "glide",
        "redrafter",
        "recycling",
    ]
    assert (config.drafts, config.strategy_drafts, config.tree, config.cascade_kwargs(), config.window) == (
        [],
        {},
        {},
        {},
        None,
    )
    specs = loading.draft_specs(config)
    assert specs == {
        "cascade": [str(loading.MODEL_CARDS / "gemma-3-270m-drafter-xs")],
        "hsddw": [str(loading.MODEL_CARDS / "gemma-3-270m-drafter-xs")],
        "glide": [str(loading.MODEL_CARDS / "gemma-3-270m-glide-xs")],
        "redrafter": [str(loading.MODEL_CARDS / "gemma-3-270m-redrafter-xs")],
    }
    assert all(
        (loading.MODEL_CARDS / f / "config.json").is_file() for group in loading.SHIPPED_HEADS.values() for f in group
    )
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--strategy", "maxgram,nope"])


def test_no_shipped_heads_without_a_checkout(monkeypatch, tmp_path):
    """A wheel has no model_cards/ and nothing is published on the Hub: the strategy needs ``--draft``."""
    monkeypatch.setattr(loading, "MODEL_CARDS", tmp_path)
    assert loading.draft_specs(_config("--strategy", "glide")) == {}
    assert loading.draft_specs(_config("--strategy", "glide", "--draft", "glide=g")) == {"glide": ["g"]}


def test_per_strategy_drafts():
    assert parse_drafts(["big", "glide=g", "cascade=a", "cascade=b", "./x=y"]) == (
        ["big", "./x=y"],
        {"glide": ["g"], "cascade": ["a", "b"]},
    )
    config = _config("--strategy", "maxgram,cascade,glide", "--draft", "cascade=a", "cascade=b", "--draft", "glide=g")
    assert config.strategy_drafts == {"cascade": ["a", "b"], "glide": ["g"]} and config.drafts == []
    assert loading.draft_specs(config) == {"cascade": ["a", "b"], "glide": ["g"]}
    # own > shared > shipped; the variants' drafts are their strategy's (glide-chain -> glide)
    assert loading.draft_specs(_config("--strategy", "cascade,hsddw", "--draft", "x", "--draft", "hsddw=y")) == {
        "cascade": ["x"],
        "hsddw": ["y"],
    }
    specs = loading.draft_specs(_config("--strategy", "cascade", "--draft", "cascade=a", "--baselines", "glide-chain"))
    assert specs["cascade"] == ["a"] and specs["glide"] == [str(loading.MODEL_CARDS / "gemma-3-270m-glide-xs")]
    # the old single-strategy form, unchanged
    old = _config("--strategy", "cascade", "--draft", "big", "small")
    assert (old.drafts, old.strategy_drafts, loading.draft_specs(old)) == (
        ["big", "small"],
        {},
        {"cascade": ["big", "small"]},
    )
    # another target: no shipped heads
    assert loading.draft_specs(_config("--target", "smollm2", "--strategy", "maxgram,glide")) == {}
    with pytest.raises(ValueError, match="name the strategy"):  # one shared model cannot be both
        _config("--strategy", "cascade,glide", "--draft", "x")
    with pytest.raises(ValueError, match="does not measure"):
        _config("--strategy", "cascade", "--draft", "hsddw=x")
    with pytest.raises(ValueError, match="takes no draft model"):
        _config("--draft", "maxgram=x")


def test_cli_stops_when_a_strategy_has_no_draft(capsys):
    with pytest.raises(SystemExit, match="--draft glide=PATH"):  # before any model is loaded
        main(["bench", "--target", "smollm2", "--strategy", "maxgram,glide"])


# -- defaults: no option given, none passed ---------------------------------------------------------


@pytest.fixture
def spies(monkeypatch):
    """The assistant classes of the bench's methods replaced by recorders of their arguments."""
    calls: dict[str, list] = {}

    def spy(name):
        def build(*args, **kwargs):
            calls.setdefault(name, []).append((args, kwargs))
            return SimpleNamespace()

        return build

    for name in ("CascadeAssistant", "DynamicWindowAssistant", "GlideAssistant", "ReDrafterAssistant"):
        monkeypatch.setattr(bench_methods, name, spy(name))
    return calls


def _built(config: BenchConfig, **drafts) -> dict:
    errors: dict = {}
    methods = _build_methods(config, object(), ["shared"], errors, strategy_drafts=drafts)
    assert not errors
    return methods


def test_assistants_get_no_options_when_none_are_given(spies):
    config = BenchConfig(
        strategy="all",
        baselines=["hsddw-single", "hsddw-every-step", "glide-chain", "redrafter-w1", "maxgram-hf-loop", "hf-assisted"],
    )
    _built(config, cascade=["xs"], hsddw=["xs"], glide=["g"], redrafter=["r"])
    hf_loop, maxgram, cascade = spies["CascadeAssistant"]  # built in method order
    assert [len(hf_loop[0][0]), len(maxgram[0][0]), len(cascade[0][0])] == [1, 1, 2] and cascade[0][0][0] == "xs"
    assert hf_loop[1] == maxgram[1] == cascade[1] == {}
    assert spies["DynamicWindowAssistant"] == [
        (("xs", None), {}),
        (("xs", None), {"policy": Policy(cost_aware=False)}),
        (("xs", None), {}),
    ]  # hsddw-single, hsddw-every-step, hsddw
    assert spies["GlideAssistant"] == [
        (("g",), {"settings": GlideSettings.chain()}),  # glide-chain
        (("g",), {}),
    ]  # glide
    assert spies["ReDrafterAssistant"] == [
        (("r",), {"settings": ReDrafterSettings(beam_width=1)}),  # redrafter-w1,
        (("r",), {}),
    ]  # redrafter


def test_only_the_options_given_are_passed(spies):
    config = BenchConfig(
        strategy="maxgram,cascade,hsddw,glide,redrafter",
        cost_aware=True,
        lenience=2.0,
        window=3,
        draft_length=4,
        beam_width=2,
        min_confidence=0.3,
    )
    methods = _built(config)
    maxgram, cascade = spies["CascadeAssistant"]
    assert maxgram[1] == {}  # Max-Gram alone is the cascade's reference: its defaults
    assert cascade[1] == {
        "settings": CascadeSettings(lenience=2.0, min_confidence=0.3),
        "policy": Policy(cost_aware=True),
    }
    assert spies["DynamicWindowAssistant"] == [
        (
            ("shared", None),  # shared drafts: old form
            {"settings": DynamicWindowSettings(max_window=3)},
        )
    ]
    assert spies["GlideAssistant"] == [(("shared",), {"settings": GlideSettings(draft_length=4, min_confidence=0.3)})]
    assert spies["ReDrafterAssistant"] == [
        (("shared",), {"settings": ReDrafterSettings(beam_width=2, min_confidence=0.3)})
    ]
    assert list(methods) == ["plain", *(s for s in STRATEGIES if s != "recycling")]
    spies.clear()
    _built(BenchConfig(strategy="maxgram", cost_aware=True, k_matrix=[[3]]))  # no cascade: the options are Max-Gram's
    assert spies["CascadeAssistant"][0][1] == {
        "policy": Policy(cost_aware=True),
        "settings": CascadeSettings(k_matrix=[[3]]),
    }


# -- one run of several strategies -------------------------------------------------------------------


@pytest.fixture(scope="module")
def multi_result(tiny):
    model, draft, tok = tiny
    config = BenchConfig(
        strategy="maxgram,cascade,glide",
        baselines=["plain", "plain-kernels"],
        max_new_tokens=NEW_TOKENS,
        warmup_tokens=2,
    )
    return run_benchmark(
        config, model, tok, PROMPTS, strategy_drafts={"cascade": [draft], "glide": [echo_glide(model)]}
    )


def test_strategies_run_interleaved_in_one_rotation(multi_result):
    r = multi_result
    assert r.methods == ["plain", "plain-kernels", "maxgram", "cascade", "glide"], r.errors
    for i in range(len(PROMPTS)):
        order = sorted((rec["order"], rec["method"]) for rec in r.records if rec["prompt_index"] == i)
        assert [m for _, m in order] == r.methods[i % 5 :] + r.methods[: i % 5]
    assert all(rec["identical_to_plain"] is True for rec in r.records), [rec["method"] for rec in r.records]
    assert set(r.environment["strategy_drafts"]) == {"cascade", "glide"}
    levels = [rec["stats"]["levels"] for rec in r.records if rec["method"] == "cascade"]
    assert all(len(lv) == 2 for lv in levels)  # its own drafter, then Max-Gram


def test_summary_against_plain_kernels_and_pairs(multi_result, tmp_path):
    r = multi_result
    s = r.summary
    for m in r.methods:
        assert s["overall"][m]["speedup_vs_plain_kernels"] > 0
        assert all(per[m]["speedup_vs_plain_kernels"] > 0 for per in s["categories"].values())
    assert s["overall"]["plain-kernels"]["speedup_vs_plain_kernels"] == pytest.approx(1.0)
    assert set(s["paired"]) == {
        f"{b}/{m}" for m in ("maxgram", "cascade", "glide") for b in ("plain", "plain-kernels")
    } | {"maxgram/cascade"}
    for p in s["paired"].values():
        assert p["prompts"] == len(PROMPTS) and p["geomean_low"] <= p["geomean"] <= p["geomean_high"]
    report = markdown_report(r)
    assert "**strategies** `maxgram,cascade,glide`" in report and "speed relative to plain-kernels" in report
    assert "| maxgram/cascade |" in report and "geo-mean per prompt" in report
    paths = write_results(r, tmp_path)
    data = json.loads(paths["json"].read_text())
    assert data["config"]["strategy"] == "maxgram,cascade,glide" and data["config"]["strategies"] == [
        "maxgram",
        "cascade",
        "glide",
    ]
    assert paths["speedup_png"].read_bytes()[:4] == b"\x89PNG" and paths["speedup_png"].stat().st_size > 1000


def test_cells_below_plain_kernels_are_marked():
    """Golden: maxgram takes twice plain-kernels' time on the ``slow`` category only."""
    times = {
        "fast": {"plain": 2.0, "plain-kernels": 2.0, "maxgram": 1.0},
        "slow": {"plain": 2.0, "plain-kernels": 1.0, "maxgram": 2.0},
    }
    records = [
        {
            "prompt_index": i,
            "category": cat,
            "method": m,
            "seconds": t,
            "new_tokens": 8,
            "identical_to_plain": True,
            "stats": None,
        }
        for i, (cat, per) in enumerate(times.items())
        for m, t in per.items()
    ]
    methods = ["plain", "plain-kernels", "maxgram"]
    result = BenchResult(
        config={"strategy": "maxgram", "strategies": ["maxgram"]},
        methods=methods,
        records=records,
        summary=summarize(records, methods, strategies=["maxgram"]),
    )
    assert below_kernels(result) == [("maxgram", "slow", 0.5)]
    table = markdown_kernels(result)
    assert "| slow | **0.50x** ✗ |" in table and "| fast | 2.00x |" in table and "| **overall** | 1.00x |" in table
    assert "maxgram on slow (0.50x)" in table
    assert paired_names(methods) == [("plain", "maxgram"), ("plain-kernels", "maxgram")]  # default: the last one
    assert markdown_kernels(BenchResult(config={}, methods=["plain", "maxgram"], records=[], summary={})) is None
    sampled = BenchResult(
        config={**result.config, "sampling": True}, methods=methods, records=records, summary=result.summary
    )
    assert "| slow | **0.50x** ✗ (8 tokens) |" in markdown_kernels(sampled)  # under sampling: the tokens there
