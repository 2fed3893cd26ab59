"""Benchmark harness: ``--strategy glide`` (with ``glide-chain``) and ``--strategy redrafter`` (with
``redrafter-w1`` and ``redrafter-flat``) on the tiny Llama of ``tests/test_bench.py``, with heads built
in-process (an echo GLIDE, a ReDrafter head fitted to the target's greedy continuations)."""

from __future__ import annotations

import pytest

from hf_cascade.bench import BenchConfig, markdown_report, run_benchmark  # noqa: E402
from hf_cascade.cli import bench_config, build_parser  # noqa: E402
from hf_cascade.drafters.lookup_branch import LookupBranch  # noqa: E402
from tests.redrafter_helpers import fit_head
from tests.test_bench import NEW_TOKENS, PROMPTS, tiny  # noqa: F401  (tiny: fixture)
from tests.test_glide_decode import echo_glide
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

CASES = {
    "glide": (["glide-chain"], lambda target: echo_glide(target)),
    "redrafter": (["redrafter-w1", "redrafter-flat"], lambda target: fit_head(target, "bench-tiny", steps=60)),
}


@pytest.mark.parametrize("strategy", list(CASES))
def test_tree_strategies_are_identical_to_plain_and_report_tree_stats(tiny, strategy):
    model, _, tok = tiny
    baselines, build = CASES[strategy]
    config = BenchConfig(
        strategy=strategy,
        baselines=baselines,
        max_new_tokens=NEW_TOKENS,
        warmup_tokens=2,
        beam_width=3,
        beam_length=3,
        draft_length=4,
    )
    r = run_benchmark(config, model, tok, PROMPTS, drafts=[build(model)])
    assert r.methods == ["plain", *baselines, strategy], r.errors
    for rec in r.records:
        assert rec["identical_to_plain"] is True, (rec["method"], rec["output_text"])
        if rec["method"] == "plain":
            continue
        s = rec["stats"]
        assert s["target_calls"] >= 1 and len(s["tree_sizes"]) == s["target_calls"]
        seeds = LookupBranch().depth  # the lookup branch's seeds (default on) may reach deeper
        if strategy == "redrafter":
            assert max(s["tree_depths"]) <= max(3, seeds)
            assert rec["method"] != "redrafter-w1" or max(s["tree_leaves"]) <= 1  # a chain
        else:
            assert max(s["tree_depths"]) <= max(4, seeds) and (rec["method"] == "glide" or max(s["tree_leaves"]) <= 1)
    flat = [rec["stats"] for rec in r.records if rec["method"] == "redrafter-flat"]
    packed = [rec["stats"] for rec in r.records if rec["method"] == "redrafter"]
    if strategy == "redrafter":  # same beams, packed: never more nodes than flat
        assert sum(map(sum, (s["tree_sizes"] for s in packed))) <= sum(map(sum, (s["tree_sizes"] for s in flat)))
    report = markdown_report(r)
    assert f"| {strategy} |" in report and "### Tree verification" in report
    tree = r.summary["tree_verification"]
    assert set(tree) == set(baselines) | {strategy}  # tree methods only, not plain
    for m, t in tree.items():
        calls = sum(rec["stats"]["target_calls"] for rec in r.records if rec["method"] == m)
        nodes = sum(sum(rec["stats"]["tree_sizes"]) for rec in r.records if rec["method"] == m)
        assert t["calls"] == calls and t["nodes_per_call"] == pytest.approx(nodes / calls)
        assert 1 <= t["head_rows_per_call"] <= t["nodes_per_call"] + 1 + 1e-9, (m, t)
        assert t["verify_ms_per_call"] > 0 and 0 < t["draft_fraction_of_verify"]


@pytest.mark.parametrize("strategy", list(CASES))
def test_tree_strategies_need_their_head(tiny, strategy):
    model, _, tok = tiny
    r = run_benchmark(
        BenchConfig(strategy=strategy, baselines=["plain"], max_new_tokens=4, warmup_tokens=1), model, tok, PROMPTS[:1]
    )
    assert r.methods == ["plain"] and "needs its trained head" in r.errors[strategy]


def test_measured_verify_cost_is_used_and_reported(tiny):
    """``--verify-cost measure``: the profile is measured on this machine before the run and recorded."""
    model, _, tok = tiny
    config = BenchConfig(
        strategy="glide",
        baselines=["glide-chain"],
        max_new_tokens=6,
        warmup_tokens=1,
        max_tree_nodes=3,
        verify_cost="measure",
    )
    r = run_benchmark(config, model, tok, PROMPTS[:1], drafts=[echo_glide(model)])
    assert r.methods == ["plain", "glide-chain", "glide"], r.errors
    profile = r.environment["verify_cost_measured"]
    assert len(profile) == 4 and profile[0] == 1.0 and profile == sorted(profile)
    assert all(rec["identical_to_plain"] for rec in r.records)


def test_cli_tree_options():
    args = build_parser().parse_args(
        [
            "bench",
            "--strategy",
            "redrafter",
            "--draft",
            "head",
            "--beam-width",
            "2",
            "--beam-length",
            "3",
            "--baselines",
            "redrafter-w1,redrafter-flat",
        ]
    )
    config = bench_config(args)
    assert (config.beam_width, config.beam_length) == (2, 3)
    assert config.methods == ["plain", "redrafter-w1", "redrafter-flat", "redrafter"]
    args = build_parser().parse_args(
        [
            "bench",
            "--strategy",
            "glide",
            "--draft",
            "g",
            "--max-tree-nodes",
            "16",
            "--draft-length",
            "4",
            "--baselines",
            "glide-chain",
            "--min-confidence",
            "0.3",
            "--min-expansion-prob",
            "0.05",
            "--verify-cost",
        ]
    )
    assert bench_config(args).tree == {
        "draft_length": 4,
        "max_tree_nodes": 16,  # only what was given
        "min_confidence": 0.3,
        "min_expansion_prob": 0.05,
        "verify_cost": "reference",
    }
    measure = build_parser().parse_args(["bench", "--strategy", "glide", "--draft", "g", "--verify-cost", "measure"])
    assert bench_config(measure).verify_cost == "measure"
    assert not bench_config(build_parser().parse_args(["bench"])).verify_cost
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--verify-cost", "guess"])
    with pytest.raises(ValueError, match="beam_width must be >= 1"):
        BenchConfig(strategy="redrafter", beam_width=0)
