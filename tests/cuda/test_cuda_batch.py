"""The batch contract of tests/test_batch.py on CUDA: left-padded batches on GPU targets.

* fp16 and bf16 targets (Llama, Gemma3 with sliding-window layers) given fp32 CPU drafters and heads: every
  registry entry gives, row for row, plain batched ``generate``'s output on ``B = 4`` rows of 1 to 25 tokens (an
  EOS inside a draft, ``max_new_tokens`` inside drafts and ``= 1``, a repetition penalty, one padded row, two
  rows one finishing at once), with one row's statistics per row; binding leaves the drafters on the target's
  device in its dtype;
* exact sampling per row (16-token vocabulary) and no state leak between batched and single calls;
* ``output_scores`` / ``output_logits``: plain batched ``generate``'s, within half precision's noise;
* ``device_map="auto"`` (``from_pretrained``): greedy parity of the batch.

Skipped without CUDA (tests/cuda/conftest.py marks them ``cuda``).
"""

from __future__ import annotations

import time

import pytest
import torch

from tests.contract_registry import REGISTRY, assert_placed, base_kit, detached_copy, fresh_kit, models_used
from tests.test_batch import (
    ASCENDING,
    ROWS,
    FakeClock,
    assert_batch_parity,
    assert_no_state_leak,
    batch_cases,
    left_pad,
    registry_assistant,
)
from tests.test_batch_api import SCORED, assert_batch_scores
from tests.test_batch_sampling import assert_exact_batch_sampling
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
ARCHS = ["llama", "gemma3"]
SAMPLING = ["maxgram", "drafter+maxgram", "glide_cape", "redrafter"]

_TARGETS: dict = {}
_CASES: dict = {}


def cuda_target(arch: str, dtype: torch.dtype, device: str = "cuda:0"):
    key = (arch, dtype, device)
    if key not in _TARGETS:
        target = detached_copy(base_kit(arch).target).to(device=device, dtype=dtype)
        target.generation_config.pad_token_id = 0
        _TARGETS[key] = target
    return _TARGETS[key]


def cases_of(key, target):
    if key not in _CASES:
        _CASES[key] = batch_cases(target)
    return _CASES[key]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(REGISTRY))
def test_batch_greedy_parity(name, arch, dtype, free_drafts, open_gate):
    target = cuda_target(arch, DTYPES[dtype])
    kit = fresh_kit(arch, target)  # fp32 CPU drafters and heads
    assistant = registry_assistant(name, kit)
    assert_batch_parity(target, assistant, cases_of((arch, dtype), target))
    assert_placed(models_used(assistant, kit), torch.device("cuda", 0), DTYPES[dtype])


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", SAMPLING)
def test_batch_exact_sampling_per_row(name, dtype, monkeypatch, free_drafts, open_gate):
    monkeypatch.setattr(time, "perf_counter", FakeClock())
    target = cuda_target("small", DTYPES[dtype])
    kit = fresh_kit("small", target)
    assert_exact_batch_sampling(target, lambda: registry_assistant(name, kit))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", list(REGISTRY))
def test_batch_no_state_leak(name, dtype, monkeypatch, open_gate):
    monkeypatch.setattr(time, "perf_counter", FakeClock())
    gemma = cuda_target("gemma3", DTYPES[dtype])
    kit = fresh_kit("gemma3", gemma)
    batch, single = left_pad(ROWS), (ASCENDING, None)
    assert_no_state_leak(gemma, lambda: registry_assistant(name, kit), batch, single, do_sample=False)
    assert_no_state_leak(gemma, lambda: registry_assistant(name, kit), single, batch, do_sample=False)
    small = cuda_target("small", DTYPES[dtype])
    kit = fresh_kit("small", small)
    batch, single = left_pad([[1, 5, 6, 5, 6, 5], [1, 9, 12], [7]]), (torch.tensor([[1, 9, 12]]), None)
    assert_no_state_leak(small, lambda: registry_assistant(name, kit), single, batch, do_sample=True)
    assert_no_state_leak(small, lambda: registry_assistant(name, kit), batch, single, do_sample=True)


@pytest.fixture(scope="module")
def auto_target(tmp_path_factory):
    """Gemma3 saved and loaded back with ``from_pretrained(..., device_map="auto", dtype=bf16)``."""
    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.mktemp("gemma3")
    base_kit("gemma3").target.save_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, device_map="auto", dtype=torch.bfloat16).eval()
    assert getattr(model, "hf_device_map", None) and model.device.type == "cuda"
    model.generation_config.pad_token_id = 0
    return model


@pytest.mark.parametrize("name", list(REGISTRY))
def test_batch_device_map_auto(name, auto_target, free_drafts, open_gate):
    kit = fresh_kit("gemma3", auto_target)
    assert_batch_parity(auto_target, registry_assistant(name, kit), cases_of("auto", auto_target))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", SCORED)
def test_batch_scores_and_logits(name, dtype, free_drafts, open_gate):
    target = cuda_target("llama", DTYPES[dtype])
    assert_batch_scores(target, fresh_kit("llama", target), name, {}, tol=0.1)
