"""examples/gpu_check.py without a model: its options, the generate() kwargs of each mode (plain and assisted alike),
the compile configuration per device, the parity summary of a bf16 divergence. A CPU smoke run of the whole script:
``python examples/gpu_check.py --max-new-tokens 16 --prompts 1 --assistants maxgram`` (a few minutes: not a test)."""

from __future__ import annotations

import importlib.util
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

    sized = {"max_cache_len": 40} if hasattr(GenerationConfig(), "max_cache_len") else {}   # 4.57 has none
    assert gpu_check.mode_kwargs("static", args, cuda, 40) == {"cache_implementation": "static", **sized,
                                                               "disable_compile": True}
    kw = gpu_check.mode_kwargs("compiled", args, cpu, 40)
    config = kw.pop("compile_config")
    assert kw == {"cache_implementation": "static", **sized}
    assert (config.backend, config.mode, config._compile_all_devices) == ("aot_eager", None, True)
    gpu = gpu_check.compile_config(args, cuda)                          # CompileConfig(): CUDA graphs on CUDA
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
