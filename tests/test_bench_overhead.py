"""``hf-cascade bench --overhead`` (hf_cascade.bench.overhead): host time and device reads per target call on the tiny
target, for every strategy, plain generate, transformers' prompt lookup and compiled plain generate; with
``--compiled-strategies`` each strategy compiled too (hf_cascade.bench.overhead_compiled), against compiled plain.

Fast: one prompt, a few tokens, one round, the compiled baseline on torch.compile's ``eager`` backend (a trace, no
code generation). No speed is asserted anywhere: only that the command runs end to end, writes its table with every
method, every output equals plain generate's, the counter sees plain decoding's reads and host times are positive.
"""

from __future__ import annotations

import json

import pytest
import torch

from hf_cascade.bench import overhead, tiny
from hf_cascade.bench.overhead import COMPILED, METHODS, ModuleTimer, ReadCounter
from hf_cascade.bench.overhead_compiled import TimedCompiledDecoder, compile_config
from hf_cascade.cli import main
from hf_cascade.core.static import static_rollback_supported
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)


@pytest.fixture(autouse=True, scope="module")
def forget_graphs_compiled_while_counting():
    """After this module, dynamo forgets its graphs: the read counter's ``TorchFunctionMode`` was active while compiled
    plain ``generate`` compiled transformers' shared forwards, and those code objects' cache entries then made a later
    ``fullgraph`` call in the same process (tests/test_compiled_drafters.py) find no compiled frame."""
    yield
    torch._dynamo.reset()


needs_static = pytest.mark.skipif(not static_rollback_supported(), reason="static caches need transformers >= 5")


@pytest.mark.measured_costs  # the command runs the cost rules as users get them
def test_overhead_command_writes_every_method(tmp_path, capsys):
    out = tmp_path / "overhead"
    threads = torch.get_num_threads()
    code = main(
        [
            "bench",
            "--overhead",
            "--new-tokens",
            "12",
            "--prompts",
            "1",
            "--repeats",
            "1",
            "--compile-backend",
            "eager",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    result = json.loads((out / "results.json").read_text())
    report = (out / "report.md").read_text()
    printed = capsys.readouterr().out
    assert set(result["methods"]) == {*METHODS, COMPILED}, result["errors"]
    assert not result["errors"], result["errors"]
    for name, m in result["methods"].items():
        assert m["identical"] is True, name  # timed and counted runs alike
        assert m["host_ms_per_call"] > 0 and m["target_calls"] > 0, name
        assert m["tokens_per_call"] > 0 and m["reads_per_call"] is not None, name
        assert m["label"] in report and m["label"] in printed, name
    plain = result["methods"]["plain"]
    assert plain["reads_per_call"] >= 1.0 and plain["reads"]["sites"]  # sanity: plain reads once per token
    assert plain["tokens_per_call"] == 1.0 and plain["host_vs_plain"] == 1.0
    assert result["compiled"]["warmup_seconds"] > 0 and "error" not in result["compiled"]
    env = result["environment"]
    assert env["torch"] == torch.__version__ and env["commit"]
    assert report.startswith("# hf-cascade bench --overhead") and "Machine:" in report
    assert f"transformers {env['transformers']}" in report
    assert torch.get_num_threads() == threads  # the command's own thread setting was undone


def test_a_failing_compile_is_reported_not_raised(monkeypatch):
    def broken(target, backend, mode, max_cache_len):
        def run(ids, new):
            raise RuntimeError("no C++ compiler\nmore detail")

        return overhead.OverheadMethod(COMPILED, target, run), target, {"compile_config": {"backend": backend}}

    monkeypatch.setattr(overhead, "_compiled_method", broken)
    result = overhead.measure_overhead(new_tokens=4, prompts=1, repeats=1, methods=["plain"])
    assert COMPILED not in result["methods"] and result["errors"][COMPILED] == "RuntimeError: no C++ compiler"
    assert "**failed**" in overhead.markdown(result)
    assert result["methods"]["plain"]["identical"]


def test_prompts_must_be_a_number_with_overhead(capsys):
    assert main(["bench", "--overhead", "--prompts", "questions.jsonl", "--no-compile"]) == 2
    assert "--prompts with --overhead is a number" in capsys.readouterr().err
    with pytest.raises(ValueError, match="from 1 to"):
        overhead.overhead_prompts(len(overhead.PROMPT_TOKENS) + 1)


def test_counter_and_timer_are_removed_and_pause():
    model = torch.nn.Linear(2, 2)
    item = torch.Tensor.item
    with pytest.raises(RuntimeError):
        with ReadCounter() as counter:
            torch.ones(1).item()
            raise RuntimeError("boom")
    assert torch.Tensor.item is item and counter.reads == 1 and counter.sites
    original = model.forward

    def reading_forward(x):
        x.sum().item()  # a read inside the module: paused
        return original(x)

    model.forward = reading_forward
    with ReadCounter(sites=False).pause_in(model) as counter, ModuleTimer([model]) as timer:
        model(torch.ones(2))
        bool(torch.ones(1))
    assert counter.reads == 1 and not counter.sites
    assert timer.calls == 1 and timer.seconds > 0
    assert not model._forward_hooks and not model._forward_pre_hooks


@pytest.mark.measured_costs
@needs_static
def test_compiled_strategies_rows():
    """A strategy's compiled row: the same assistant with a static cache and compiled plain's CompileConfig, its
    output plain's, its verification compiled, its ratios against compiled plain (the eager row's against plain)."""
    result = overhead.measure_overhead(
        new_tokens=10,
        prompts=2,
        repeats=1,
        methods=["plain", "maxgram"],
        compile_backend="aot_eager",
        compiled_strategies=True,
    )
    assert not result["errors"], result["errors"]
    methods = result["methods"]
    assert list(methods) == ["plain", "maxgram", COMPILED, "maxgram-compiled"]
    row, base, plain, eager = methods["maxgram-compiled"], methods[COMPILED], methods["plain"], methods["maxgram"]
    assert row["identical"] is True and row["compiled"] is True and row["baseline"] == COMPILED
    assert row["target_calls"] > 0 and row["target_forward_ms_per_call"] > 0 and row["tokens_per_call"] > 0
    assert row["host_vs_plain"] == pytest.approx(row["host_ms_per_call"] / base["host_ms_per_token"])
    assert row["speedup"] == pytest.approx(base["wall_ms_per_token"] / row["wall_ms_per_token"])
    assert eager["baseline"] == "plain" and eager["host_vs_plain"] == pytest.approx(
        eager["host_ms_per_call"] / plain["host_ms_per_call"]
    )
    assert eager["speedup"] == pytest.approx(plain["wall_ms_per_token"] / eager["wall_ms_per_token"])
    info = result["compiled_strategies"]
    assert info["compiled"] == {"maxgram-compiled": True} and info["warmup_seconds"]["maxgram-compiled"] > 0
    assert info["graphs_after_warmup"] > 0 and info["graphs_after_timed"] >= info["graphs_after_warmup"]
    report = overhead.markdown(result)
    assert row["label"] in report and "(vs compiled plain)" in report and "Compiled strategies (" in report


def test_strategy_and_baselines_choose_the_methods(tmp_path):
    """``--strategy`` and ``--baselines`` name what ``--overhead`` measures, in the bench's names (``glide``: GLIDE +
    CAPE; ``glide-chain``: its chain), plain always; a baseline it cannot measure is an error naming those it can."""
    out = tmp_path / "overhead"
    code = main(
        [
            "bench",
            "--overhead",
            "--strategy",
            "maxgram,glide",
            "--baselines",
            "glide-chain",
            "--new-tokens",
            "8",
            "--prompts",
            "1",
            "--repeats",
            "1",
            "--no-compile",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    methods = json.loads((out / "results.json").read_text())["methods"]
    assert list(methods) == ["plain", "maxgram", "glide", "glide-chain"]
    assert methods["glide"]["label"].startswith("GLIDE + CAPE") and methods["glide-chain"]["label"].startswith(
        "GLIDE chain"
    )
    assert main(["bench", "--overhead", "--strategy", "maxgram", "--baselines", "suffix", "--no-compile"]) == 2


def test_compiled_strategies_need_compile(capsys):
    assert main(["bench", "--overhead", "--compiled-strategies", "--no-compile", "--no-progress"]) == 2
    assert "drop --no-compile" in capsys.readouterr().err


@needs_static
def test_timed_compiled_decoder_counts_the_compiled_forward():
    """The core's compiled decoder, wrapped for a run: every verification's time inside it is counted (no decoder
    hook here: the timer has no module), and the kept entry is restored."""
    from hf_cascade import CascadeAssistant, MaxGram
    from hf_cascade.core import compiled

    target, assistant = tiny.llama_target(), CascadeAssistant([MaxGram()])
    prompt = torch.tensor([list(overhead.PROMPT_TOKENS[0])])
    config = compile_config("aot_eager", None)

    def run():
        return target.generate(
            prompt,
            do_sample=False,
            max_new_tokens=12,
            assistant_model=assistant,
            cache_implementation="static",
            compile_config=config,
            max_cache_len=40,
        )

    timer = ModuleTimer()
    with TimedCompiledDecoder(target, timer):  # nothing compiled yet: nothing wrapped
        run()
    assert timer.calls == 0
    kept = compiled._COMPILED[target.get_decoder()]
    with TimedCompiledDecoder(target, timer):
        assert compiled._COMPILED[target.get_decoder()] is not kept
        run()
    assert timer.calls == assistant.last_stats.target_calls > 0 and timer.seconds > 0
    assert compiled._COMPILED[target.get_decoder()] is kept
