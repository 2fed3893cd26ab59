"""``hf-cascade bench --overhead`` (hf_cascade.bench.overhead): host time and device reads per target call on the tiny
target, for every strategy, plain generate, transformers' prompt lookup and compiled plain generate.

Fast: one prompt, a few tokens, one round, the compiled baseline on torch.compile's ``eager`` backend (a trace, no
code generation). No speed is asserted anywhere: only that the command runs end to end, writes its table with every
method, every output equals plain generate's, the counter sees plain decoding's reads and host times are positive.
"""

from __future__ import annotations

import json

import pytest
import torch

from hf_cascade.bench import overhead
from hf_cascade.bench.overhead import COMPILED, METHODS, ModuleTimer, ReadCounter
from hf_cascade.cli import main
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)


@pytest.mark.measured_costs           # the command runs the cost rules as users get them
def test_overhead_command_writes_every_method(tmp_path, capsys):
    out = tmp_path / "overhead"
    threads = torch.get_num_threads()
    code = main(["bench", "--overhead", "--new-tokens", "12", "--prompts", "1", "--repeats", "1",
                 "--compile-backend", "eager", "--no-progress", "--out", str(out)])
    assert code == 0
    result = json.loads((out / "results.json").read_text())
    report = (out / "report.md").read_text()
    printed = capsys.readouterr().out
    assert set(result["methods"]) == {*METHODS, COMPILED}, result["errors"]
    assert not result["errors"], result["errors"]
    for name, m in result["methods"].items():
        assert m["identical"] is True, name                       # timed and counted runs alike
        assert m["host_ms_per_call"] > 0 and m["target_calls"] > 0, name
        assert m["tokens_per_call"] > 0 and m["reads_per_call"] is not None, name
        assert m["label"] in report and m["label"] in printed, name
    plain = result["methods"]["plain"]
    assert plain["reads_per_call"] >= 1.0 and plain["reads"]["sites"]       # sanity: plain reads once per token
    assert plain["tokens_per_call"] == 1.0 and plain["host_vs_plain"] == 1.0
    assert result["compiled"]["warmup_seconds"] > 0 and "error" not in result["compiled"]
    env = result["environment"]
    assert env["torch"] == torch.__version__ and env["commit"]
    assert report.startswith("# hf-cascade bench --overhead") and "Machine:" in report
    assert f"transformers {env['transformers']}" in report
    assert torch.get_num_threads() == threads                    # the command's own thread setting was undone


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
        x.sum().item()                                       # a read inside the module: paused
        return original(x)

    model.forward = reading_forward
    with ReadCounter(sites=False).pause_in(model) as counter, ModuleTimer([model]) as timer:
        model(torch.ones(2))
        bool(torch.ones(1))
    assert counter.reads == 1 and not counter.sites
    assert timer.calls == 1 and timer.seconds > 0
    assert not model._forward_hooks and not model._forward_pre_hooks
