"""The static-cache path on CUDA (issue 55): every registry entry with ``cache_implementation="static"``, eager and
compiled with ``CompileConfig()`` (transformers' default: inductor, mode ``reduce-overhead`` = CUDA graphs), against
plain ``generate`` with the same cache and compile settings (the helpers: tests/static_contract.py).

* fp32 and bf16 targets (Llama; Gemma3 with sliding-window layers, which the core keeps full and windows by the
  mask) given fp32 CPU drafters and heads: in fp32 every output is plain ``generate``'s token for token; in bf16 a
  divergence passes only where the target's logits make it a tie (:mod:`hf_cascade.parity`), and is printed with
  its logit gap (``-s`` or ``-rP`` shows it);
* compiled: verification runs the core's compiled decoder, a second pass over the cases captures no new dynamo
  graph, and no frame reaches dynamo's recompile limit (where it would silently run eagerly). The targets of this
  module share dynamo's per-code-object caches (transformers' forward wrappers), so the limit is raised here to the
  default per target; :func:`test_one_target_every_strategy` runs a user's process instead: one bf16 target, every
  strategy, twice, within the default limit (and, known to fail, the same without ``max_cache_len``);
* a ``device_map="auto"`` target (``from_pretrained``, fp32 and bf16), eager and compiled;
* batches of two and three ragged prompts (:func:`~tests.static_contract.static_batch_cases`), every registry entry,
  eager and compiled, against plain batched ``generate`` with the same settings, compiled with a second pass that
  captures no new graph.

Every static setting has one ``max_cache_len`` (tests/static_contract.py's ``CACHE_LEN``), as a compiled deployment
sets it.

Skipped without CUDA (tests/cuda/conftest.py marks them ``cuda``), and before transformers 5 (no static rollback).
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.exc

from hf_cascade.core.static import static_rollback_supported
from tests.contract_registry import REGISTRY, base_kit, detached_copy, fresh_kit
from tests.static_contract import (
    MODES,
    check_every_strategy,
    check_second_pass,
    check_static_batch_parity,
    check_static_parity,
    default_recompile_limit,
    static_batch_cases,
    static_cases,
    strict_recompiles,
    target_settings,
)
from tests.test_batch import registry_assistant
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.skipif(not static_rollback_supported(), reason="static caches need transformers >= 5")

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
ARCHS = ["llama", "gemma3"]
#: the batch sizes a compiled target verifies here (batch 1 and the batches of two and three rows): a graph each
BATCH_SIZES = 3

_TARGETS: dict = {}
_CASES: dict = {}


@pytest.fixture(autouse=True, scope="module")
def recompile_limit():
    """Dynamo's recompile limit times the targets this module compiles (4 of :func:`cuda_target`, at
    :data:`BATCH_SIZES` batch sizes, and 2 loaded with ``device_map="auto"``), reaching it an error
    (:func:`strict_recompiles`)."""
    targets = len(ARCHS) * len(DTYPES) * BATCH_SIZES + len(DTYPES)
    with strict_recompiles(recompile_limit=default_recompile_limit() * targets):
        yield


def cuda_target(arch: str, dtype: str):
    """``arch``'s fp32 base target copied to ``cuda:0`` in ``dtype`` (one per session: its compiled graphs are
    kept)."""
    if (arch, dtype) not in _TARGETS:
        _TARGETS[(arch, dtype)] = detached_copy(base_kit(arch).target).to("cuda:0", DTYPES[dtype])
    return _TARGETS[(arch, dtype)]


def cases_of(key, target, mode: str):
    """:func:`static_cases` of ``target`` in ``mode`` (plain ``generate`` with the same settings), once per key."""
    if (key, mode) not in _CASES:
        _CASES[(key, mode)] = static_cases(target, target_settings(mode, target))
    return _CASES[(key, mode)]


def report(ties: list[str], record_property) -> None:
    for line in ties:
        print(f"bf16 tie: {line}")
    record_property("bf16_ties", len(ties))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(REGISTRY))
def test_static_greedy_parity(name, arch, dtype, mode, free_drafts, record_property):
    target = cuda_target(arch, dtype)
    assistant = REGISTRY[name](fresh_kit(arch, target))  # fp32 CPU drafters and heads
    ties = check_static_parity(target, assistant, cases_of((arch, dtype), target, mode), exact=dtype == "fp32")
    report(ties, record_property)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(REGISTRY))
def test_compiled_second_pass_compiles_nothing(name, arch, dtype, free_drafts, record_property):
    target = cuda_target(arch, dtype)
    assistant = REGISTRY[name](fresh_kit(arch, target))
    cases = cases_of((arch, dtype), target, "compiled")
    report(check_second_pass(target, assistant, cases, exact=dtype == "fp32"), record_property)


# -- batches ---------------------------------------------------------------------------------------------------

_BATCH_CASES: dict = {}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(REGISTRY))
def test_static_batch_parity(name, arch, dtype, mode, free_drafts, open_gate, record_property):
    """Batches of two and three ragged prompts, every registry entry: plain batched ``generate``'s rows with the same
    static settings (bf16: up to ties); compiled, a second pass captures no new graph."""
    target = cuda_target(arch, dtype)
    if (arch, dtype, mode) not in _BATCH_CASES:
        _BATCH_CASES[(arch, dtype, mode)] = static_batch_cases(target, target_settings(mode, target))
    cases = _BATCH_CASES[(arch, dtype, mode)]
    assistant = registry_assistant(name, fresh_kit(arch, target))  # fp32 CPU drafters and heads
    if mode == "compiled":
        ties = check_second_pass(target, assistant, cases, exact=dtype == "fp32", parity=check_static_batch_parity)
    else:
        ties = check_static_batch_parity(target, assistant, cases, exact=dtype == "fp32")
    report(ties, record_property)


# -- device_map="auto" -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=list(DTYPES))
def auto_target(request, tmp_path_factory):
    """Gemma3 saved and loaded back with ``from_pretrained(..., device_map="auto", dtype=...)``."""
    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.mktemp("gemma3")
    base_kit("gemma3").target.save_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, device_map="auto", dtype=DTYPES[request.param]).eval()
    assert getattr(model, "hf_device_map", None) and model.device.type == "cuda"
    return request.param, model


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(REGISTRY))
def test_static_device_map_auto(name, mode, auto_target, free_drafts, record_property):
    dtype, target = auto_target
    assistant = REGISTRY[name](fresh_kit("gemma3", target))
    cases = cases_of(("auto", dtype, id(target)), target, mode)
    if mode == "compiled":
        ties = check_second_pass(target, assistant, cases, exact=dtype == "fp32")
    else:
        ties = check_static_parity(target, assistant, cases, exact=dtype == "fp32")
    report(ties, record_property)


# -- a user's process: one target, every strategy ----------------------------------------------------------------


@pytest.mark.parametrize("sized", [True, False])
def test_one_target_every_strategy(sized, free_drafts, record_property):
    """Dynamo reset, one bf16 Gemma3 target, compiled: plain ``generate`` and every registry entry over the cases,
    twice, within dynamo's default recompile limit and no new graph in the second round; ``sized``: with
    ``max_cache_len``, else each call's cache sized by its own length."""
    target = detached_copy(base_kit("gemma3").target).to("cuda:0", torch.bfloat16)
    makers = {name: (lambda make=make: make(fresh_kit("gemma3", target))) for name, make in REGISTRY.items()}
    settings = target_settings("compiled", target, **({} if sized else {"max_cache_len": None}))
    report(check_every_strategy(target, makers, settings, exact=False), record_property)


# -- exact sampling on the device -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(REGISTRY))
def test_static_exact_sampling(name, mode, monkeypatch, free_drafts):
    """The contract's exact sampling (joint law of the first three tokens, per-step calibration; 16-token vocabulary,
    fp32) with the target on ``cuda:0`` and a static cache, eager and compiled (CUDA graphs): the ``q`` handed to
    verification is the law each draft was drawn from, on the device as on the CPU (tests/test_static_contract.py)."""
    import time

    from tests.test_contract import FakeClock, assert_exact_sampling

    monkeypatch.setattr(time, "perf_counter", FakeClock())
    target = detached_copy(base_kit("small").target).to("cuda:0")
    settings = target_settings(mode, target)
    target.generation_config.update(**{k: v for k, v in settings.items() if k != "disable_compile"})
    target.generation_config.disable_compile = mode == "eager"
    kit = fresh_kit("small", target)
    assert_exact_sampling(target, lambda: registry_assistant(name, kit))
