"""The contract of tests/test_contract.py on CUDA: every registry entry on GPU targets.

* fp16 and bf16 targets (Llama, Gemma3 with sliding-window layers) given fp32 CPU drafters and heads:
  greedy parity with plain ``generate`` of the same target, exact sampling (16-token vocabulary), no state
  leak; binding leaves the drafters on the target's device in its dtype;
* ``device_map="auto"`` (``from_pretrained``), and a target dispatched by accelerate across two devices
  (``cuda:0`` + ``cuda:1``, or ``cuda:0`` + CPU offload executed on ``cuda:0`` with one GPU);
* drafters on another device than the target: left on the CPU (``Loading(place=False)``; on ``cuda:1`` too
  with two GPUs), and the default, where binding moves them to the target;
* flash attention (when ``flash_attn`` is installed): chains (every linear entry, and the tree strategies' chain
  settings) keep parity on dynamic and static caches, eager and compiled, at batch 1 and on left-padded batches of
  ragged rows; trees with branches (GLIDE + CAPE, ReDrafter's beams, Max-Gram trees, Token Recycling) refuse with a
  ValueError before any forward, batched or not.

Skipped without CUDA (tests/cuda/conftest.py marks them ``cuda``).
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import replace

import pytest
import torch

from tests.contract_registry import detached_copy
from tests.test_contract import (
    ASCENDING,
    REGISTRY,
    REPETITIVE,
    WITH_MODELS,
    FakeClock,
    assert_exact_sampling,
    assert_greedy_parity,
    assert_no_state_leak,
    assert_placed,
    base_kit,
    fresh_kit,
    greedy_cases,
    models_used,
)
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
ARCHS = ["llama", "gemma3"]
TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2

_TARGETS: dict = {}
_CASES: dict = {}


def cuda_target(arch: str, dtype: torch.dtype, device: str = "cuda:0"):
    key = (arch, dtype, device)
    if key not in _TARGETS:
        _TARGETS[key] = detached_copy(base_kit(arch).target).to(device=device, dtype=dtype)
    return _TARGETS[key]


def cases_of(key, target):
    if key not in _CASES:
        _CASES[key] = greedy_cases(target)
    return _CASES[key]


# -- fp16 / bf16 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(REGISTRY))
def test_greedy_parity(name, arch, dtype):
    target = cuda_target(arch, DTYPES[dtype])
    kit = fresh_kit(arch, target)  # fp32 CPU drafters and heads
    assistant = REGISTRY[name](kit)
    assert_greedy_parity(target, assistant, cases_of((arch, dtype), target))
    assert_placed(models_used(assistant, kit), torch.device("cuda", 0), DTYPES[dtype])


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", list(REGISTRY))
def test_exact_sampling(name, dtype):
    target = cuda_target("small", DTYPES[dtype])
    kit = fresh_kit("small", target)
    assert_exact_sampling(target, lambda: REGISTRY[name](kit))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", list(REGISTRY))
def test_no_state_leak(name, dtype, monkeypatch):
    monkeypatch.setattr(time, "perf_counter", FakeClock())
    gemma = cuda_target("gemma3", DTYPES[dtype])
    kit = fresh_kit("gemma3", gemma)
    assert_no_state_leak(gemma, lambda: REGISTRY[name](kit), REPETITIVE, ASCENDING, do_sample=False)
    small = cuda_target("small", DTYPES[dtype])
    kit = fresh_kit("small", small)
    assert_no_state_leak(small, lambda: REGISTRY[name](kit), ids(1, 5, 6, 5, 6, 5), ids(1, 9, 12), do_sample=True)


# -- device_map -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def auto_target(tmp_path_factory):
    """Gemma3 saved and loaded back with ``from_pretrained(..., device_map="auto", dtype=bf16)``."""
    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.mktemp("gemma3")
    base_kit("gemma3").target.save_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, device_map="auto", dtype=torch.bfloat16).eval()
    assert getattr(model, "hf_device_map", None) and model.device.type == "cuda"
    return model


@pytest.mark.parametrize("name", list(REGISTRY))
def test_device_map_auto(name, auto_target):
    kit = fresh_kit("gemma3", auto_target)
    assert_greedy_parity(auto_target, REGISTRY[name](kit), cases_of("auto", auto_target))


@pytest.fixture(scope="module")
def split_target():
    """Gemma3 (bf16) dispatched by accelerate across two devices: embeddings and layer 0 on ``cuda:0``, the
    last layer, final norm and head on ``cuda:1`` (two GPUs) or offloaded to the CPU and executed on
    ``cuda:0`` (one GPU)."""
    from accelerate import dispatch_model

    model = detached_copy(base_kit("gemma3").target).to(torch.bfloat16)
    second = 1 if TWO_GPUS else "cpu"
    device_map = {
        "model.embed_tokens": 0,
        "model.rotary_emb": 0,
        "model.layers.0": 0,
        "model.layers.1": second,
        "model.norm": second,
        "lm_head": second,
    }
    if hasattr(model.model, "rotary_emb_local"):
        device_map["model.rotary_emb_local"] = 0
    return dispatch_model(model, device_map=device_map, main_device=0)


@pytest.mark.parametrize("name", list(REGISTRY))
def test_dispatched_across_devices(name, split_target):
    kit = fresh_kit("gemma3", split_target)
    assert_greedy_parity(split_target, REGISTRY[name](kit), cases_of("split", split_target))


# -- drafters on another device ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", WITH_MODELS)
def test_drafters_left_where_the_user_put_them(name):
    """``Loading(place=False)``: fp32 drafters and heads stay on the CPU, the fp32 target runs on ``cuda:0``
    (what crosses devices is moved where it is used); outputs equal plain generate."""
    target = cuda_target("gemma3", torch.float32)
    kit = fresh_kit("gemma3", target)
    assistant = REGISTRY[name](kit)
    assistant.loading = replace(assistant.loading, place=False)
    assert_greedy_parity(target, assistant, cases_of(("gemma3", "fp32"), target))
    assert_placed(models_used(assistant, kit), torch.device("cpu"), torch.float32)


@pytest.mark.skipif(not TWO_GPUS, reason="needs two GPUs")
@pytest.mark.parametrize("name", WITH_MODELS)
def test_drafters_on_another_gpu(name):
    """``Loading(place=False)`` with the drafters on ``cuda:1`` and the target on ``cuda:0``."""
    target = cuda_target("gemma3", torch.float32)
    kit = fresh_kit("gemma3", target)
    assistant = REGISTRY[name](kit)
    for m in models_used(assistant, kit):
        m.to("cuda:1")
    assistant.loading = replace(assistant.loading, place=False)
    assert_greedy_parity(target, assistant, cases_of(("gemma3", "fp32"), target))
    assert_placed(models_used(assistant, kit), torch.device("cuda", 1), torch.float32)


@pytest.mark.parametrize("name", WITH_MODELS)
def test_drafters_placed_by_default(name):
    """The default: binding moves CPU fp32 drafters and heads to the target's device and dtype."""
    target = cuda_target("gemma3", torch.bfloat16)
    kit = fresh_kit("gemma3", target)
    assistant = REGISTRY[name](kit)
    used = models_used(assistant, kit)
    assert used and all(next(m.parameters()).device.type == "cpu" for m in used)
    assert_greedy_parity(target, assistant, cases_of(("gemma3", "bf16"), target))
    assert_placed(used, torch.device("cuda", 0), torch.bfloat16)


# -- flash attention ------------------------------------------------------------------------------------------

HAS_FLASH = importlib.util.find_spec("flash_attn") is not None
from tests.test_flash_like import BRANCHING, CHAIN_FACTORIES  # noqa: E402  (the CPU proof's entries)

FLASH_CHAINS = list(CHAIN_FACTORIES)


@pytest.fixture(scope="module")
def flash_target():
    model = detached_copy(base_kit("gemma3").target).to("cuda:0", torch.bfloat16)
    model.set_attn_implementation("flash_attention_2")
    return model


@pytest.mark.skipif(not HAS_FLASH, reason="needs flash_attn")
@pytest.mark.parametrize("mode", ["dynamic", "eager", "compiled"])
@pytest.mark.parametrize("name", FLASH_CHAINS)
def test_flash_attention_chains(name, mode, flash_target):
    """Chains are verified with plain causal attention, which flash applies bottom-right aligned: on a dynamic cache
    and on a static one, eager and compiled (its layers show flash the prefix and the queries only), plain
    ``generate``'s output under flash (bf16: ties judged, tests/static_contract.py). The CPU proof of the same rules:
    tests/test_flash_like.py."""
    from tests.static_contract import check_static_parity, static_cases, target_settings

    kit = fresh_kit("gemma3", flash_target)
    settings = {} if mode == "dynamic" else target_settings(mode, flash_target)
    check_static_parity(flash_target, CHAIN_FACTORIES[name](kit), static_cases(flash_target, settings), exact=False)


@pytest.mark.skipif(not HAS_FLASH, reason="needs flash_attn")
@pytest.mark.measured_costs  # the verification profile measured at bind time, as users get it
@pytest.mark.parametrize("name", BRANCHING)
def test_flash_attention_refused_by_tree_drafts(name, flash_target, monkeypatch):
    """GLIDE + CAPE, ReDrafter's beams, Max-Gram trees and Token Recycling draft trees with branches, which need the
    core's 4-D mask: a ValueError before any forward, binding's measurement included."""
    from hf_cascade import measure

    monkeypatch.setattr(measure, "_MEASURED", {})
    assistant = REGISTRY[name](fresh_kit("gemma3", flash_target))
    forwards = []
    handle = flash_target.register_forward_pre_hook(lambda *a: forwards.append(1))
    try:
        with pytest.raises(ValueError, match="flash_attention_2"):
            flash_target.generate(REPETITIVE.to("cuda:0"), do_sample=False, max_new_tokens=5, assistant_model=assistant)
    finally:
        handle.remove()
    assert forwards == []


@pytest.mark.skipif(not HAS_FLASH, reason="needs flash_attn")
@pytest.mark.parametrize("mode", ["dynamic", "eager", "compiled"])
@pytest.mark.parametrize("name", FLASH_CHAINS)
def test_flash_attention_batches_of_chains(name, mode, flash_target, free_drafts, open_gate):
    """A left-padded batch of chains (2 and 3 ragged rows, rows finishing apart) under the real flash kernel: its
    padding, holes and finished rows hidden by the 2-D ownership mask flash unpads
    (``hf_cascade.core.batch_state.ownership_mask``), on a dynamic cache and a static one, eager and compiled: plain
    batched ``generate``'s rows under flash (bf16: ties judged, and rare). The CPU proof: tests/test_flash_like.py."""
    from tests.static_contract import (
        check_static_batch_parity,
        default_recompile_limit,
        static_batch_cases,
        strict_recompiles,
        target_settings,
    )
    from tests.test_batch import flat_profile

    assistant = flat_profile(CHAIN_FACTORIES[name](fresh_kit("gemma3", flash_target)))
    settings = {} if mode == "dynamic" else target_settings(mode, flash_target)
    cases = static_batch_cases(flash_target, settings)
    with strict_recompiles(recompile_limit=4 * default_recompile_limit()):
        ties = check_static_batch_parity(flash_target, assistant, cases, exact=False)
    assert len(ties) <= sum(len(expected) for *_, expected in cases) // 4, ties


@pytest.mark.skipif(not HAS_FLASH, reason="needs flash_attn")
@pytest.mark.measured_costs
@pytest.mark.parametrize("name", BRANCHING)
def test_flash_attention_batches_of_trees_refused(name, flash_target, monkeypatch):
    """A batch of tree drafts under flash: a ValueError before any forward, binding's measurement included."""
    from hf_cascade import measure
    from tests.static_contract import left_padded

    monkeypatch.setattr(measure, "_MEASURED", {})
    assistant = REGISTRY[name](fresh_kit("gemma3", flash_target))
    ids, mask = left_padded([REPETITIVE[0].tolist(), REPETITIVE[0, 3:].tolist()], "cuda:0")
    forwards = []
    handle = flash_target.register_forward_pre_hook(lambda *a: forwards.append(1))
    try:
        with pytest.raises(ValueError, match="flash_attention_2"):
            flash_target.generate(
                ids, attention_mask=mask, do_sample=False, max_new_tokens=5, pad_token_id=0, assistant_model=assistant
            )
    finally:
        handle.remove()
    assert forwards == []
