"""The contract with a static cache, eager and compiled (:mod:`hf_cascade.core.static`,
:mod:`hf_cascade.core.compiled`).

Every assistant of the registry, on targets whose ``generation_config`` asks for ``cache_implementation="static"``
(so plain ``generate``, the reference, runs static too):

* greedy parity on Llama and on Gemma3 (sliding-window layers: the core's static cache keeps them full and
  windows by the mask), eager; and compiled (``CompileConfig(_compile_all_devices=True)``, the ``aot_eager``
  backend: the same dynamo graphs as inductor, without code generation), where a second pass over the cases
  captures no new graph (nothing recompiles after warm-up);
* exact sampling (the contract's joint-law and calibration tests) with a static cache;
* a user's ``StaticCache`` (sliding layers included) and a user's compiled forward, which verification calls;
* clear errors: a filled ``StaticCache``. Batches with a static cache: tests/test_static_contract.py.
"""

from __future__ import annotations

import copy
import time

import pytest
import torch
from transformers import CompileConfig, StaticCache

import hf_cascade  # noqa: F401
from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.core.static import QUERY_BUCKETS, bucket, static_rollback_supported
from tests.contract_registry import REGISTRY, base_kit, detached_copy, fresh_kit, setting_target
from tests.test_contract import (
    ASCENDING,
    REPETITIVE,
    FakeClock,
    assert_exact_sampling,
    assert_greedy_parity,
    greedy_cases,
)
from tests.tiny_models import ids, single_thread  # noqa: F401

pytestmark = pytest.mark.skipif(
    not static_rollback_supported(),
    reason="static caches need transformers >= 5 (test_static_refused_before_5 runs there)",
)


def static_target(target, compiled: bool = False):
    """A copy of ``target`` whose ``generate`` uses a static cache (and compiles, with ``compiled``)."""
    out = copy.deepcopy(target)
    out.generation_config.cache_implementation = "static"
    if compiled:
        config = CompileConfig(backend="aot_eager", mode=None)
        config._compile_all_devices = True
        out.generation_config.compile_config = config
    return out


_STATIC: dict = {}


def static_setting(setting: str, compiled: bool = False):
    key = (setting, compiled)
    if key not in _STATIC:
        target = static_target(setting_target(setting), compiled)
        _STATIC[key] = (target, greedy_cases(target))
    return _STATIC[key]


@pytest.mark.parametrize("setting", ["llama-sdpa", "gemma3-sdpa"])
@pytest.mark.parametrize("name", list(REGISTRY))
def test_static_greedy_parity(name, setting, free_drafts):
    target, cases = static_setting(setting)
    assert_greedy_parity(target, REGISTRY[name](fresh_kit(setting.split("-")[0], target)), cases)


def unique_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@pytest.mark.parametrize("name", list(REGISTRY))
def test_compiled_greedy_parity_without_recompiles(name, free_drafts):
    target, cases = static_setting("llama-sdpa", compiled=True)
    assistant = REGISTRY[name](fresh_kit("llama", target))
    assert_greedy_parity(target, assistant, cases)  # warm-up: every bucket the cases reach
    before = unique_graphs()
    assert_greedy_parity(target, assistant, cases)
    assert unique_graphs() == before


def test_compiled_verification_runs_the_compiled_decoder(free_drafts):
    """The compiled path is taken (a compiled call per verification), and its graphs are kept across calls."""
    from hf_cascade.core import compiled

    target, cases = static_setting("llama-sdpa", compiled=True)
    assert compiled.compiles(target, StaticCache(config=target.config, max_cache_len=8), target.generation_config)
    calls = []
    decoder = target.get_decoder()
    handle = decoder.register_forward_pre_hook(lambda *a: calls.append(torch.compiler.is_compiling()))
    try:
        assert_greedy_parity(target, CascadeAssistant([MaxGram()]), cases[:1])
    finally:
        handle.remove()
    assert calls and any(calls)


@pytest.mark.parametrize("name", list(REGISTRY))
def test_static_exact_sampling(name, monkeypatch):
    monkeypatch.setattr(time, "perf_counter", FakeClock())
    target = static_target(base_kit("small").target)
    kit = fresh_kit("small", target)
    assert_exact_sampling(target, lambda: REGISTRY[name](kit))


@pytest.mark.parametrize("setting", ["llama-sdpa", "gemma3-sdpa"])
def test_user_static_cache(setting):
    """A user's StaticCache (Gemma3's has sliding-window layers) is used and holds the K/V afterwards; its size
    caps the drafts near its end; the output equals plain generate with its own StaticCache."""
    target = setting_target(setting)
    prompt, new = REPETITIVE, 24
    size = prompt.shape[1] + new
    plain = target.generate(
        prompt,
        do_sample=False,
        max_new_tokens=new,
        **{hf_cascade.compat.CACHE: StaticCache(config=target.config, max_cache_len=size)},
    )
    cache = StaticCache(config=target.config, max_cache_len=size)
    out = target.generate(
        prompt,
        do_sample=False,
        max_new_tokens=new,
        return_dict_in_generate=True,
        assistant_model=CascadeAssistant([MaxGram()]),
        **{hf_cascade.compat.CACHE: cache},
    )
    assert out.sequences.tolist() == plain.tolist()
    assert getattr(out, hf_cascade.compat.CACHE) is cache
    assert all(layer.is_initialized and not layer.is_sliding for layer in cache.layers)


def test_user_compiled_forward_is_used():
    """A target whose forward the user compiled: verification goes through it, never around it to the decoder."""
    target = detached_copy(setting_target("llama-sdpa"))
    plain = target.generate(REPETITIVE, do_sample=False, max_new_tokens=20)
    seen = []
    original = target.forward

    def forward(*args, **kwargs):
        seen.append(kwargs["input_ids"].shape[1])
        return original(*args, **kwargs)

    target.forward = torch.compile(forward, backend="eager")
    for cache_implementation in (None, "static"):
        seen.clear()
        out = target.generate(
            REPETITIVE,
            do_sample=False,
            max_new_tokens=20,
            cache_implementation=cache_implementation,
            assistant_model=CascadeAssistant([MaxGram()]),
        )
        assert out.tolist() == plain.tolist()
        assert len(seen) > 2 and max(seen[1:]) > 1  # prefill, then verifications with drafts


def test_max_cache_len_sizes_the_cache_once(free_drafts):
    """With ``max_cache_len`` set, the core's static cache has the same size for every prompt (``max_cache_len`` +
    the last query bucket), so prompts of other lengths run the graphs already compiled (none new)."""
    target = static_target(setting_target("llama-sdpa"), compiled=True)  # a fresh copy: its own graphs
    assistant = CascadeAssistant([MaxGram()])
    plain = detached_copy(setting_target("llama-sdpa"))
    for i, prompt in enumerate((REPETITIVE, ids(1, 9), REPETITIVE[:, :5], ASCENDING)):
        out = target.generate(prompt, do_sample=False, max_new_tokens=24, max_cache_len=64, assistant_model=assistant)
        assert out.tolist() == plain.generate(prompt, do_sample=False, max_new_tokens=24).tolist()
        if i == 0:
            before = unique_graphs()  # the first prompt compiled every shape the others reach
    assert unique_graphs() == before


def test_compiled_redrafter_ends_generations_without_new_graphs(free_drafts):
    """Compiled, ReDrafter's beam search runs at its full length and cuts the beams where fewer tokens may still be
    emitted, so a generation whose last step has room for 1, 2 or 3 tokens compiles nothing new after warm-up."""
    target = static_target(setting_target("llama-sdpa"), compiled=True)  # a fresh copy: its own graphs
    assistant = REGISTRY["redrafter"](fresh_kit("llama", target))  # beam length 4
    plain = detached_copy(setting_target("llama-sdpa"))
    for i, new_tokens in enumerate((24, 21, 22, 23, 25)):
        out = target.generate(
            REPETITIVE, do_sample=False, max_new_tokens=new_tokens, max_cache_len=64, assistant_model=assistant
        )
        assert out.tolist() == plain.generate(REPETITIVE, do_sample=False, max_new_tokens=new_tokens).tolist()
        if i == 0:
            before = unique_graphs()
    assert unique_graphs() == before


def test_core_sized_cache_honours_max_cache_len():
    """Where the core builds its static cache, its capacity is ``max_cache_len`` (else ``max_length``) plus the last
    query bucket; compiled, never less than the largest it built for the same target before (one cache shape for
    calls of other lengths, as transformers keeps its largest static cache)."""
    from transformers import GenerationConfig

    from hf_cascade.core.loop import _Run
    from hf_cascade.core.stats import GenerationStats

    compile_config = CompileConfig(backend="aot_eager", mode=None)
    compile_config._compile_all_devices = True
    for compiled, sizes in (
        (True, ((None, 30, 30), (48, 30, 48), (None, 40, 48), (None, 60, 60))),
        (False, ((None, 30, 30), (48, 30, 48), (None, 40, 40), (None, 60, 60))),
    ):
        target = detached_copy(setting_target("llama-sdpa"))  # compiled: the largest so far; eager: the call's
        for max_cache_len, max_length, capacity in sizes:
            cfg = GenerationConfig(
                max_length=max_length,
                cache_implementation="static",
                max_cache_len=max_cache_len,
                compile_config=compile_config if compiled else None,
            )
            run = _Run(target, REPETITIVE, None, None, cfg, GenerationStats(), None, 4)
            assert run.slots.capacity == capacity + QUERY_BUCKETS[-1], (compiled, max_cache_len, max_length)
            assert run.fixed_shapes == compiled
    # through generate, which builds a cache sized for plain decoding: the core's own has room for the last bucket
    target = detached_copy(setting_target("llama-sdpa"))
    out = target.generate(
        REPETITIVE,
        do_sample=False,
        max_new_tokens=20,
        cache_implementation="static",
        return_dict_in_generate=True,
        assistant_model=CascadeAssistant([MaxGram()]),
    )
    cache = getattr(out, hf_cascade.compat.CACHE)
    assert {layer.max_cache_len for layer in cache.layers} == {REPETITIVE.shape[1] + 20 + QUERY_BUCKETS[-1]}


def test_buckets():
    assert [bucket(q, 100) for q in (1, 2, 3, 5, 9, 33)] == [1, 2, 4, 8, 16, 64]
    assert bucket(3, 3) == 3 and bucket(5, 6) == 6
    assert bucket(QUERY_BUCKETS[-1] + 5, 1000) == QUERY_BUCKETS[-1] + 5


def test_static_refuses_a_filled_cache():
    """A filled StaticCache is refused, at batch 1 and for a batch (batches with a static cache run:
    tests/test_static_contract.py)."""
    target = setting_target("llama-sdpa")
    cache = StaticCache(config=target.config, max_cache_len=64)
    target(ids(1, 2, 3), **{hf_cascade.compat.CACHE: cache})
    with pytest.raises(ValueError, match="filled StaticCache"):
        target.generate(
            REPETITIVE,
            do_sample=False,
            max_new_tokens=4,
            assistant_model=CascadeAssistant([MaxGram()]),
            **{hf_cascade.compat.CACHE: cache},
        )
    batch = torch.tensor([[1, 5, 6, 7], [1, 9, 10, 11]])
    with pytest.raises(ValueError, match="filled StaticCache"):
        target.generate(
            batch,
            attention_mask=torch.ones_like(batch),
            do_sample=False,
            max_new_tokens=4,
            assistant_model=CascadeAssistant([MaxGram()]),
            **{hf_cascade.compat.CACHE: cache},
        )


def test_static_takes_an_early_initialised_cache():
    """A StaticCache initialised in advance (``early_initialization``, as export and CUDA-graph recipes do) but never
    written is empty, not filled: the call runs on it, at batch 1 and for a batch, with plain static ``generate``'s
    output; once written it is refused."""
    target = setting_target("llama-sdpa")
    text = target.config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads

    def early(batch_size):
        cache = StaticCache(config=target.config, max_cache_len=64)
        cache.early_initialization(batch_size, text.num_key_value_heads, head_dim, target.dtype, target.device)
        assert all(layer.is_initialized for layer in cache.layers)
        return cache

    batch = torch.tensor([[1, 5, 6, 7, 5, 6, 7], [0, 0, 1, 9, 10, 9, 10]])
    for prompt, mask in ((REPETITIVE, None), (batch, (batch != 0).long())):
        kwargs = dict(do_sample=False, max_new_tokens=12, attention_mask=mask)
        plain = target.generate(prompt, **kwargs, **{hf_cascade.compat.CACHE: early(prompt.shape[0])})
        cache = early(prompt.shape[0])
        out = target.generate(
            prompt, **kwargs, assistant_model=CascadeAssistant([MaxGram()]), **{hf_cascade.compat.CACHE: cache}
        )
        assert torch.equal(out, plain)
        with pytest.raises(ValueError, match="filled StaticCache"):
            target.generate(
                prompt, **kwargs, assistant_model=CascadeAssistant([MaxGram()]), **{hf_cascade.compat.CACHE: cache}
            )


def test_eager_static_attention_sees_the_prefix_and_the_queries_only():
    """Eager (not compiled), the core's static layers hand attention the verified prefix and the forward's own
    queries, not the whole buffer; handed back to the user, the cache is a plain static one again."""
    from hf_cascade.core.static import StaticSlots

    target = setting_target("llama-sdpa")
    slots = StaticSlots(target, None, 32, fixed_shapes=False)
    layer = slots.cache.layers[0]
    slots.show(5)
    keys, values = layer.update(torch.ones(1, 2, 5, 8), torch.ones(1, 2, 5, 8))
    assert keys.shape[2] == values.shape[2] == 5 and layer.get_mask_sizes(5) == (5, 0)
    slots.show(None)
    assert layer.update(torch.ones(1, 2, 1, 8), torch.ones(1, 2, 1, 8))[0].shape[2] == 32
    assert layer.get_mask_sizes(1) == (32, 0)
    out = target.generate(
        REPETITIVE,
        do_sample=False,
        max_new_tokens=12,
        cache_implementation="static",
        return_dict_in_generate=True,
        assistant_model=CascadeAssistant([MaxGram()]),
    )
    assert all(getattr(layer, "visible", None) is None for layer in getattr(out, hf_cascade.compat.CACHE).layers)


def test_compiled_verification_compiles_its_shapes_beyond_a_shared_recompile_limit():
    """dynamo keeps ``recompile_limit`` graphs per code object and then runs eagerly without an error; the decoder's
    ``forward`` is shared by transformers' compiled plain decoding and every batch size's query buckets. The core's
    compiled decoder compiles each of its own shapes anyway (here: a limit of 3, strict, and 6 shapes), with the
    eager decoder's outputs; a known shape runs within the user's limit, which is left as it was."""
    import torch._dynamo
    from transformers import CompileConfig

    from hf_cascade.core.compiled import compiled_decoder

    decoder = detached_copy(setting_target("llama-sdpa")).get_decoder()
    call = compiled_decoder(decoder, CompileConfig(backend="aot_eager", mode=None))
    torch._dynamo.reset()
    shapes = [(1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 4)]
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True, recompile_limit=3):
        for rows, queries in shapes + shapes:
            x = torch.arange(1, 1 + rows * queries).reshape(rows, queries) % 60 + 3
            out = call(input_ids=x, use_cache=False).last_hidden_state
            torch.testing.assert_close(out, decoder(input_ids=x, use_cache=False).last_hidden_state)
        assert torch._dynamo.config.recompile_limit == 3
        with pytest.raises(Exception, match="recompile_limit|cache_size_limit"):  # the limit it overcomes
            plain = torch.compile(decoder.__call__, backend="aot_eager", dynamic=False)
            for rows, queries in shapes:
                plain(input_ids=torch.full((rows, queries + 8), 5), use_cache=False)


@pytest.mark.parametrize(
    "parents, queries",
    [((), 1), ((-1, 0, 1), 4), ((-1, 0, 1, 2, 0, 4, 1, 6), 16), ((-1, -1, 1, 1), 8), (tuple(range(-1, 70)), 72)],
)
def test_query_ancestors_golden(parents, queries):
    """The verification's query closure ``[root, nodes, padding]`` from host bits equals the row-by-row closure:
    the root an ancestor of every node, each node its parent's ancestors and itself, padding itself only."""
    from hf_cascade.core.attention import query_ancestors as _query_ancestors

    expected = torch.eye(queries, dtype=torch.bool)
    for i, p in enumerate(parents, start=1):
        expected[i] |= expected[p + 1]
    assert torch.equal(_query_ancestors(parents, queries, torch.device("cpu")), expected)
    chain = _query_ancestors((-1, 0, 1), 4, torch.device("cpu"))
    assert chain.tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
        [True, True, True, True],
    ]
