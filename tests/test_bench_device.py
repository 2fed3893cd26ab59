"""``hf-cascade bench`` on any device (issue 72): the device options and their defaults per machine (a CPU's run as
before; on an accelerator bfloat16 and the plain-compiled baseline), the loader's placement (dtype, device_map,
attention implementation), every timed call synchronised, and the report naming the device. No GPU here: an
accelerator is faked where the defaults or the synchronisation are what is tested."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("matplotlib")

from hf_cascade.bench import BenchConfig, calls, markdown_report, run_benchmark, runner  # noqa: E402  # noqa: E402
from hf_cascade.bench.loading import load_drafts, load_model, target_placement  # noqa: E402
from hf_cascade.bench.methods import Method  # noqa: E402
from hf_cascade.cli import bench_config, build_parser  # noqa: E402
from tests.test_bench import PROMPTS, _llama, _tokenizer  # noqa: E402

DEVICE_OPTIONS = ("--device", "--dtype", "--device-map", "--attn-implementation")


def _accelerator(monkeypatch, cuda: bool) -> None:
    """This process sees a CUDA device (``cuda``) or no accelerator at all."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    if hasattr(torch, "xpu"):
        monkeypatch.setattr(torch.xpu, "is_available", lambda: False)


def _config(*argv: str) -> BenchConfig:
    return bench_config(build_parser().parse_args(["bench", *argv]))


def test_cpu_defaults_unchanged(monkeypatch):
    """Without an accelerator: the CPU, float32, plain alone, no map or attention set (left out of results)."""
    _accelerator(monkeypatch, cuda=False)
    config = _config()
    assert (config.device, config.dtype, config.device_map, config.attn_implementation) == (
        "cpu",
        "float32",
        None,
        None,
    )
    assert config.methods == ["plain", "maxgram"]
    assert {"device_map", "attn_implementation"}.isdisjoint(config.to_dict())
    assert target_placement(config) == {"dtype": torch.float32, "device_map": None, "attn_implementation": None}


def test_accelerator_defaults(monkeypatch):
    """With a CUDA device: the target on it in bfloat16, baselines plain and plain-compiled; every default yields to
    what is given, and ``--device cpu`` is the CPU's run."""
    _accelerator(monkeypatch, cuda=True)
    config = _config("--strategy", "glide")
    assert (config.device, config.dtype) == ("cuda", "bfloat16")
    assert config.methods == ["plain", "plain-compiled", "glide"]
    assert target_placement(config) == {"dtype": torch.bfloat16, "device_map": "cuda", "attn_implementation": None}
    given = _config(
        "--device",
        "cuda:1",
        "--dtype",
        "float16",
        "--baselines",
        "pld",
        "--device-map",
        "auto",
        "--attn-implementation",
        "flash_attention_2",
    )
    assert (given.device, given.dtype, given.methods) == ("cuda:1", "float16", ["plain", "pld", "maxgram"])
    assert target_placement(given) == {
        "dtype": torch.float16,
        "device_map": "auto",
        "attn_implementation": "flash_attention_2",
    }
    assert given.to_dict()["device_map"] == "auto"
    assert _config("--device-map", '{"": 0}').device_map == {"": 0}
    cpu = _config("--device", "cpu")
    assert (cpu.device, cpu.dtype, cpu.methods) == ("cpu", "float32", ["plain", "maxgram"])


def test_bad_device_options(monkeypatch):
    _accelerator(monkeypatch, cuda=False)
    with pytest.raises(ValueError, match="unknown device"):
        BenchConfig(device="gpu")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--device", "gpu"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--dtype", "fp8"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--device-map", "{not json"])


def test_help_shows_the_device_options():
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["bench"]
    text = " ".join(sub.format_help().split())  # argparse wraps lines
    assert all(option in text for option in DEVICE_OPTIONS)
    assert "--device cuda" in text  # how a GPU user runs it


def test_loader_honours_the_placement(tmp_path, monkeypatch):
    """A target directory loads in the dtype, with the device_map (what ``from_pretrained`` is given: on a CPU a map
    leaves no trace on the model) and the attention implementation given; a causal-LM draft follows the target's
    dtype; nothing given: float32, no map, transformers' attention."""
    from transformers import AutoModelForCausalLM

    _llama(0, 1).save_pretrained(tmp_path / "m")
    _tokenizer().save_pretrained(tmp_path / "m")
    maps = []
    load = AutoModelForCausalLM.from_pretrained.__func__
    monkeypatch.setattr(
        AutoModelForCausalLM,
        "from_pretrained",
        classmethod(lambda cls, *a, **kw: (maps.append(kw.get("device_map")), load(cls, *a, **kw))[1]),
    )
    model, tok = load_model(
        str(tmp_path / "m"), dtype=torch.bfloat16, device_map={"": "cpu"}, attn_implementation="eager"
    )
    assert tok is not None and {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert maps == [{"": "cpu"}]
    assert model.config._attn_implementation == "eager"
    plain, _ = load_model(str(tmp_path / "m"))
    assert {p.dtype for p in plain.parameters()} == {torch.float32} and maps[-1] is None
    assert plain.config._attn_implementation != "eager"
    (draft,) = load_drafts([str(tmp_path / "m")], target=model)
    assert {p.dtype for p in draft.parameters()} == {torch.bfloat16}


def test_every_timed_call_synchronises(monkeypatch):
    """``timed`` waits for every device it is given before each clock read; the runner gives it the target's
    accelerators (faked here: the CPU has none)."""
    events: list = []
    monkeypatch.setattr(calls, "synchronize", lambda device: events.append(("sync", str(device))))

    class Recorded(Method):
        def run(self, ids, mask, kwargs):
            events.append("run")
            return ids, None

    calls.timed(
        Recorded("m", None),
        torch.ones(1, 2, dtype=torch.long),
        None,
        {},
        0,
        devices=(torch.device("cuda", 0), torch.device("cuda", 1)),
    )
    assert events == [("sync", "cuda:0"), ("sync", "cuda:1"), "run", ("sync", "cuda:0"), ("sync", "cuda:1")]

    events.clear()
    monkeypatch.setattr(runner, "accelerators", lambda model: (torch.device("cuda", 0),))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    model, tok = _llama(0, 1), _tokenizer()
    config = BenchConfig(strategy="maxgram", max_new_tokens=4, warmup_tokens=2, cost_models=[])
    result = run_benchmark(config, model, tok, PROMPTS[:1])
    timed_runs = 2 * len(config.methods)  # a warm-up and one prompt per method
    assert events.count(("sync", "cuda:0")) == 2 * timed_runs
    assert result.environment["device"]["name"] == "Fake GPU"  # the report names the accelerator


def test_report_names_the_device():
    model, tok = _llama(0, 1), _tokenizer()
    result = run_benchmark(
        BenchConfig(strategy="maxgram", max_new_tokens=4, warmup_tokens=2, cost_models=[]), model, tok, PROMPTS[:1]
    )
    device = result.environment["device"]
    assert (device["device"], device["dtype"], device["accelerators"]) == ("cpu", "float32", [])
    assert device["name"].startswith("CPU")
    assert result.config["device"] == "cpu" and result.config["dtype"] == "float32"
    assert "**Device** `cpu` (CPU" in markdown_report(result)
