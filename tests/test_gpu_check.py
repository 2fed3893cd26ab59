"""examples/gpu_check.py without a model: its options, the generate() kwargs of each mode (plain and assisted alike),
the compile configuration per device, the parity summary of a bf16 divergence, the cuda tests' step (a faked pytest
run), and the whole check on the CPU (``--device cpu``, a tiny target) with its JSON summary."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from hf_cascade.parity import Divergence

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_modes_and_their_kwargs(gpu_check):
    args = gpu_check.parse_args(["--device", "cpu", "--modes", "static,compiled"])
    assert args.modes == ["static", "compiled"] and args.dtype == "fp32"
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert gpu_check.mode_kwargs("eager", args, cpu, 40) == {}
    from transformers import GenerationConfig

    sized = {"max_cache_len": 40} if hasattr(GenerationConfig(), "max_cache_len") else {}  # 4.57 has none
    assert gpu_check.mode_kwargs("static", args, cuda, 40) == {
        "cache_implementation": "static",
        **sized,
        "disable_compile": True,
    }
    kw = gpu_check.mode_kwargs("compiled", args, cpu, 40)
    config = kw.pop("compile_config")
    assert kw == {"cache_implementation": "static", **sized}
    assert (config.backend, config.mode, config._compile_all_devices) == ("aot_eager", None, True)
    gpu = gpu_check.compile_config(args, cuda)  # CompileConfig(): CUDA graphs on CUDA
    assert (gpu.backend, gpu.mode, gpu._compile_all_devices) == ("inductor", "reduce-overhead", None)
    args = gpu_check.parse_args(["--device", "cpu", "--compile-backend", "inductor", "--compile-mode", "max-autotune"])
    assert args.modes == list(gpu_check.MODES)
    config = gpu_check.compile_config(args, cpu)
    assert (config.backend, config.mode, config._compile_all_devices) == ("inductor", "max-autotune", True)
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--modes", "jit"])


def test_parity_summary(gpu_check):
    tie = Divergence(position=37, expected=5, got=6, top1=20.0, top2=19.9, gap=0.1, got_gap=0.1, tolerance=0.5)
    assert gpu_check.parity_text([("same", None), ("same", None)]) == "2/2"
    assert gpu_check.parity_text([("same", None), ("tie", tie)]) == "1/2 +1 tie @37 gap 0.1"
    assert gpu_check.parity_text([("mismatch", tie)]) == "0/1 1 MISMATCH @37 gap 0.1"


def test_cuda_tests_step(gpu_check, monkeypatch):
    """The cuda tests run where asked (auto: on a CUDA device) and their counts come from pytest's junit report; a
    failed run is a failure of the check."""
    args = gpu_check.parse_args(["--device", "cpu"])
    assert gpu_check.run_cuda_tests(args) == {"ran": False, "reason": "device cpu"}
    commands = []

    def pytest_run(command, cwd):
        commands.append(command)
        report = next(c for c in command if c.startswith("--junitxml=")).split("=", 1)[1]
        Path(report).write_text('<testsuites><testsuite tests="5" failures="1" errors="0" skipped="2"/></testsuites>')
        return 1

    monkeypatch.setattr(gpu_check.subprocess, "call", pytest_run)
    result = gpu_check.run_cuda_tests(gpu_check.parse_args(["--device", "cpu", "--cuda-tests", "yes"]))
    assert (result["passed"], result["failures"], result["skipped"], result["exit_code"]) == (2, 1, 2, 1)
    assert commands[0][-1] == str(gpu_check.CUDA_TESTS) and "cuda" in commands[0]
    assert gpu_check.cuda_tests_failed(result)
    assert not gpu_check.cuda_tests_failed({"ran": False, "reason": "device cpu"})


def test_runs_on_the_cpu(gpu_check, tmp_path):
    """The whole check with ``--device cpu`` on a tiny target (no drafters given: their assistants are skipped rows):
    every mode's parity with plain, speeds against compiled plain generate, one JSON summary, exit status 0."""
    from tests.test_bench import _llama, _tokenizer

    _llama(0, 2).save_pretrained(tmp_path / "tiny")
    _tokenizer().save_pretrained(tmp_path / "tiny")
    out = tmp_path / "summary.json"
    code = gpu_check.main(
        [
            "--device",
            "cpu",
            "--model",
            str(tmp_path / "tiny"),
            "--prompts",
            "1",
            "--max-new-tokens",
            "8",
            "--json",
            str(out),
        ]
    )
    summary = json.loads(out.read_text())
    assert code == 0 and summary["ok"] and summary["failures"] == 0
    assert summary["cuda_tests"] == {"ran": False, "reason": "device cpu"}
    assert summary["environment"]["device"] == "cpu" and list(summary["rows"]) == ["fp32"]
    rows = {(r["method"], r["mode"]): r for r in summary["rows"]["fp32"]}
    assert set(rows) == {(m, mode) for m in ["plain generate", *gpu_check.assistants({})] for mode in gpu_check.MODES}
    compiled = rows["plain generate", "compiled"]["tokens_per_second"]  # the baseline of every speed
    from hf_cascade.core.static import static_rollback_supported

    for name in ("maxgram", "maxgram_tree", "recycling"):  # the assistants without a drafter
        for mode in gpu_check.MODES:
            row = rows[name, mode]
            if mode != "eager" and not static_rollback_supported():  # transformers 4.57: a row that says why
                assert row["parity"] == "skipped (static caches need transformers >= 5)", row
                continue
            assert row["parity"].startswith("1/1") and row["differences"] == [], row
            assert row["vs_compiled"] == pytest.approx(row["tokens_per_second"] / compiled)
    assert rows["glide", "eager"]["parity"] == "skipped (no --glide)"
