"""Drafter models' own forwards compiled where verification is (issue 55): the cascade's and HSDDW's
:class:`~hf_cascade.drafters.neural.NeuralLevel` and GLIDE's draft forward run through ``torch.compile`` over a static
draft cache (:class:`~hf_cascade.drafters.static_forward.StaticDraftForward`) with the call's ``CompileConfig``: greedy
outputs identical to plain compiled ``generate``, nothing recompiled after warm-up, the forward compiled whole
(``fullgraph``: no silent eager fallback), and eager calls keep their eager drafts. The cascade is the registry's
``lenience3`` (a fixed Max-Gram lookahead: its drafts do not depend on measured times, which a compile inflates).

CUDA graphs (issue 72): a graph's outputs live in its own memory and are overwritten by its next replay, so outputs of
forwards compiled with a configuration that records graphs (:func:`~hf_cascade.core.compiled.records_graphs`) are
copied or consumed before the next replay. :func:`replaying` gives those semantics to the CPU."""

from __future__ import annotations

import pytest
import torch
from transformers import CompileConfig

import hf_cascade  # noqa: F401  (installs the generate() hook)
from hf_cascade.core import compiled
from hf_cascade.core.compiled import records_graphs
from hf_cascade.core.draws import ProposalChoice
from hf_cascade.core.static import static_rollback_supported
from tests.contract_registry import REGISTRY, fresh_kit, models_used, setting_target
from tests.static_contract import (
    check_second_pass,
    compile_config,
    default_recompile_limit,
    static_cases,
    static_settings,
    strict_recompiles,
    unique_graphs,
)
from tests.test_contract import ASCENDING, REPETITIVE
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.skipif(not static_rollback_supported(), reason="static caches need transformers >= 5")

SETTING = "llama-sdpa"
#: one cache length for the module (every test's graphs are of one cache shape), room for the long generation
CACHE_LEN = 160
_CASES: dict = {}


def whole_graph_settings() -> dict:
    """The compiled settings (:func:`static_settings`) with ``fullgraph``: a graph break raises instead of running
    part of a forward eagerly."""
    config = compile_config("cpu")
    config.fullgraph = True
    return {**static_settings("compiled", "cpu", max_cache_len=CACHE_LEN), "compile_config": config}


def cases():
    """The first three contract cases (a repetitive prompt, one token, an EOS inside drafts) with the settings."""
    if "compiled" not in _CASES:
        _CASES["compiled"] = static_cases(setting_target(SETTING), whole_graph_settings())[:3]
    return _CASES["compiled"]


def compiled_entries(model) -> list:
    """``(function name, its compiled call)`` of ``model``'s compiled draft forwards (``compiled_draft``)."""
    return [(name, call) for name, (_, call) in compiled._DRAFTS.get(model, {}).items()]


def dynamo_entries(fn_name: str) -> int:
    """Graphs dynamo holds for the draft forward function ``fn_name`` (its code object's cache entries)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from hf_cascade.drafters import neural
    from hf_cascade.glide import drafter

    fn = {"_lm_forward": neural._lm_forward, "_glide_forward": drafter._glide_forward}[fn_name]
    return len(_debug_get_cache_entry_list(fn.__code__))


@pytest.mark.parametrize("name", ["lenience3", "hsddw", "glide", "glide_cape"])
def test_drafter_forwards_compile_where_verification_does(name, free_drafts, open_gate):
    """Eager static: the drafter models stay eager. Compiled: each drafter model's forward ran as compiled graphs
    (kept per model; fullgraph), outputs identical to plain compiled ``generate``, a second pass compiles nothing."""
    target = setting_target(SETTING)
    kit = fresh_kit("llama", target)
    assistant = REGISTRY[name](kit)
    models = models_used(assistant, kit)
    assert models
    prompt, kw = REPETITIVE, {"max_new_tokens": 12, **static_settings("eager", "cpu")}
    plain = target.generate(prompt, do_sample=False, **kw)
    assert torch.equal(target.generate(prompt, do_sample=False, assistant_model=assistant, **kw), plain)
    assert not any(compiled_entries(m) for m in models)
    with strict_recompiles(recompile_limit=4 * default_recompile_limit()):  # the module's targets share frames
        assert check_second_pass(target, assistant, cases(), exact=True) == []
    for model in models:
        ((fn_name, call),) = compiled_entries(model)
        assert call.seen and dynamo_entries(fn_name) > 0


def test_no_recompile_over_a_long_generation(free_drafts, open_gate):
    """After a warm-up generation, a long one from another prompt (drafts accepted in part, catch-up forwards of
    varying lengths) compiles nothing, for a chain drafter model and GLIDE+CAPE, with outputs identical to plain."""
    target = setting_target(SETTING)
    settings = whole_graph_settings()
    kit = fresh_kit("llama", target)
    for name in ("lenience3", "glide_cape"):
        assistant = REGISTRY[name](kit)
        with strict_recompiles(recompile_limit=4 * default_recompile_limit()):
            target.generate(REPETITIVE, do_sample=False, assistant_model=assistant, max_new_tokens=40, **settings)
            plain = target.generate(ASCENDING, do_sample=False, max_new_tokens=120, **settings)
            before = unique_graphs()
            out = target.generate(ASCENDING, do_sample=False, assistant_model=assistant, max_new_tokens=120, **settings)
        assert unique_graphs() == before, f"{name}: {unique_graphs() - before} new dynamo graph(s) after warm-up"
        assert torch.equal(out, plain), name
        accepted = assistant.last_stats.accepted_per_call
        assert len(set(accepted)) > 2, (name, accepted)  # drafts of varying fates
        ((_, call),) = compiled_entries(models_used(assistant, kit)[0])
        assert len({key[0] for key in call.seen}) > 1  # catch-up forwards of several lengths


# -- CUDA graphs' output semantics ---------------------------------------------------------------------------


def replaying(gm, example_inputs):
    """A dynamo backend with a CUDA graph's output semantics on any device: each graph writes its outputs into buffers
    of its own, which its next run overwrites (outputs that are inputs' storage pass through, as in a graph)."""
    buffers: dict[int, torch.Tensor] = {}

    def run(*args):
        outs = gm(*args)
        inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        kept = []
        for i, out in enumerate(outs):
            if not isinstance(out, torch.Tensor) or out.untyped_storage().data_ptr() in inputs:
                kept.append(out)
                continue
            buf = buffers.get(i)
            if buf is None or (buf.shape, buf.stride(), buf.dtype) != (out.shape, out.stride(), out.dtype):
                buf = buffers[i] = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=out.device)
            kept.append(buf.copy_(out))
        return type(outs)(kept) if isinstance(outs, (tuple, list)) else kept

    return run


def running(gm, example_inputs):
    """The same graphs, each run's outputs its own (the reference for :func:`replaying`)."""
    return gm


@pytest.fixture
def fresh_dynamo():
    """dynamo's graphs of the module's earlier tests forgotten: the forwards' code objects are shared, and a
    ``fullgraph`` call past their recompile limit raises."""
    torch._dynamo.reset()


def graph_settings(backend) -> dict:
    """Compiled static settings with ``backend`` (a callable: :func:`records_graphs` takes it to record graphs)."""
    config = CompileConfig(backend=backend, mode=None, fullgraph=True)
    config._compile_all_devices = True
    return {"cache_implementation": "static", "max_cache_len": CACHE_LEN, "compile_config": config}


def test_records_graphs_follows_inductor():
    """The modes and options under which inductor records CUDA graphs (``triton.cudagraphs``), dynamo's
    ``cudagraphs`` backend, and a callable backend (unknown: copied)."""
    cases = [
        ("inductor", "reduce-overhead", None, True),
        ("inductor", "max-autotune", None, True),
        ("inductor", "max-autotune-no-cudagraphs", None, False),
        ("inductor", "default", None, False),
        ("inductor", None, None, False),
        ("inductor", None, {"triton.cudagraphs": True}, True),
        ("inductor", None, {"max_autotune": True}, False),
        ("aot_eager", None, None, False),
        ("cudagraphs", None, None, True),
        (replaying, None, None, True),
    ]
    for backend, mode, options, expected in cases:
        assert records_graphs(CompileConfig(backend=backend, mode=mode, options=options)) is expected, (backend, mode)
    assert records_graphs(None) is True  # CompileConfig()'s reduce-overhead


@pytest.mark.parametrize("name", ["lenience3", "hsddw", "glide_cape", "redrafter"])
def test_greedy_outputs_survive_replays(name, free_drafts, open_gate, fresh_dynamo):
    """Every forward compiled under graph replay semantics (verification's and the drafters'): greedy outputs
    identical to plain ``generate`` with the same compiled settings."""
    target = setting_target(SETTING)
    assistant = REGISTRY[name](fresh_kit("llama", target))
    settings = graph_settings(replaying)
    for prompt, n in ((REPETITIVE, 24), (ASCENDING, 40)):
        plain = target.generate(prompt, do_sample=False, max_new_tokens=n, **settings)
        out = target.generate(prompt, do_sample=False, assistant_model=assistant, max_new_tokens=n, **settings)
        assert torch.equal(out, plain), name


def test_glide_root_row_survives_replays(free_drafts, open_gate, fresh_dynamo, monkeypatch):
    """Sampled GLIDE + CAPE keeps its first draft position's logits until the target's verdict (the proposal choice's
    measure), across the draft forwards after it: under graph replays the choice measures the same distributions,
    and the seeded outputs are those of the same graphs without replays."""
    seen: list = []
    observe = ProposalChoice.observe
    monkeypatch.setattr(
        ProposalChoice,
        "observe",
        lambda self, p, q, *a, **kw: (seen.append(q.clone()), observe(self, p, q, *a, **kw))[1],
    )
    target = setting_target(SETTING)
    kit = fresh_kit("llama", target)
    runs = []
    for backend in (running, replaying):
        seen.clear()
        torch.manual_seed(0)
        out = target.generate(
            ASCENDING,
            do_sample=True,
            temperature=1.5,
            assistant_model=REGISTRY["glide_cape"](kit),
            max_new_tokens=60,
            **graph_settings(backend),
        )
        runs.append((out, list(seen)))
    (plain_out, plain_seen), (out, replayed) = runs
    assert len(plain_seen) > 3 and len(replayed) == len(plain_seen)
    assert all(torch.equal(a, b) for a, b in zip(plain_seen, replayed))
    assert torch.equal(out, plain_out)
