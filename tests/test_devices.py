"""Device and dtype discipline (issue 26): drafters and heads placed like the target at bind (bf16 target,
fp32 heads cast once, outputs identical to plain bf16 ``generate``), ``place_drafters=False`` leaving them
alone, accelerate-dispatched / offloaded models (meta weights) left where they are, K/V and review outputs
crossing devices explicitly, the tree mask in the embeddings' dtype, the attention-backend check, and device
synchronisation before clocks that decide something. Host reads per target call: ``test_host_reads.py``."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache, LogitsProcessorList

import hf_cascade  # noqa: F401  (installs the generate() hook)
from hf_cascade import (
    CascadeAssistant,
    CascadeSettings,
    DynamicWindowAssistant,
    DynamicWindowSettings,
    GlideConfig,
    GlideForCausalLM,
    GlideSettings,
    Loading,
    Policy,
    ReDrafterAssistant,
    ReDrafterSettings,
    placement,
)
from hf_cascade.core import TokenTree
from hf_cascade.core.attention import needs_tree_mask
from hf_cascade.core.forward import _tree_inputs, check_attention_backend, mask_device_dtype
from hf_cascade.core.stats import LevelStats
from hf_cascade.drafters.maxgram import MaxGram
from hf_cascade.drafters.neural import NeuralLevel
from hf_cascade.drafters.self_draft import first_layers_drafter
from hf_cascade.glide import GlideAssistant
from hf_cascade.measure import measure_verify_cost
from hf_cascade.placement import is_dispatched, place_like, synchronize, target_device_dtype
from tests import tiny_models as tm
from tests.redrafter_helpers import fit_head
from tests.test_glide_decode import echo_glide
from tests.test_greedy_parity import REPETITIVE
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

NEW = 30


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def pair(request):
    """An fp32 tiny target (to build drafters and heads from) and its bf16 copy (the target under test)."""
    fp32 = tm.llama_target() if request.param == "llama" else tm.gemma3_target()
    return {"name": request.param, "fp32": fp32, "bf16": copy.deepcopy(fp32).to(torch.bfloat16)}


def greedy(target, assistant=None, prompt=REPETITIVE, **kw):
    kw.setdefault("max_new_tokens", NEW)
    return target.generate(prompt, do_sample=False, assistant_model=assistant, **kw).tolist()


def float_dtypes(module) -> set:
    """Dtypes of the float parameters (rotary ``inv_freq`` buffers stay float32 by design)."""
    return {t.dtype for t in module.parameters() if t.is_floating_point()}


# -- placement ----------------------------------------------------------------------------------------------


def test_place_like_casts_float_weights_keeps_int_buffers_and_rotary_and_is_idempotent(pair):
    target = pair["bf16"]
    assert target_device_dtype(target) == (torch.device("cpu"), torch.bfloat16)
    glide = GlideForCausalLM(
        GlideConfig.from_target(
            pair["fp32"],
            draft_vocab_size=24,
            num_hidden_layers=1,
            intermediate_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    )
    glide.set_vocab_subset(torch.arange(24) * 2)
    inv_freq = {n: b.dtype for n, b in glide.named_buffers() if n.endswith("inv_freq")}
    assert place_like(glide, target) is glide
    assert {p.dtype for p in glide.parameters()} == {torch.bfloat16}
    assert glide.vocab_subset.dtype == torch.long and glide.vocab_subset.tolist() == (torch.arange(24) * 2).tolist()
    assert inv_freq and all(dict(glide.named_buffers())[n].dtype == d for n, d in inv_freq.items())  # transient: kept
    before = {n: t for n, t in list(glide.named_parameters()) + list(glide.named_buffers())}
    place_like(glide, target)  # already placed: nothing changes
    after = {n: t for n, t in list(glide.named_parameters()) + list(glide.named_buffers())}
    assert all(after[n] is t for n, t in before.items())


def test_place_like_keeps_tied_weights_tied_and_respects_keep_in_fp32():
    model = tm.llama(seed=1)
    model.lm_head.weight = model.model.embed_tokens.weight  # tied
    model._keep_in_fp32_modules = ["norm"]
    place_like(model, dtype=torch.bfloat16)
    assert model.lm_head.weight is model.model.embed_tokens.weight and model.lm_head.weight.dtype == torch.bfloat16
    assert model.model.norm.weight.dtype == torch.float32
    assert model.model.layers[0].input_layernorm.weight.dtype == torch.float32  # matched inside names, as
    assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16  # transformers' regex does


def test_dispatched_and_offloaded_modules_are_left_alone():
    from accelerate import cpu_offload

    model = tm.llama(seed=2)
    expected = greedy(model)
    cpu_offload(model, execution_device="cpu")  # weights on meta, hooks load them
    assert is_dispatched(model) and model.model.embed_tokens.weight.is_meta
    assert target_device_dtype(model) == (torch.device("cpu"), torch.float32)  # the hook's execution device
    place_like(model, dtype=torch.bfloat16)
    assert model.model.embed_tokens.weight.is_meta and model.model.embed_tokens.weight.dtype == torch.float32
    drafter = first_layers_drafter(model, 1)  # borrows the offload hooks
    assert drafter(torch.tensor([[1, 5, 6]])).logits.shape == (1, 3, tm.VOCAB)
    assert greedy(model) == expected


def test_first_layers_drafter_does_not_move_the_targets_parameters():
    target = tm.llama(seed=3, layers=3)
    params = {n: (p, p.data_ptr(), p.dtype) for n, p in target.named_parameters()}
    drafter = first_layers_drafter(target, 2)
    assert drafter.model.layers[0].self_attn.q_proj.weight is target.model.layers[0].self_attn.q_proj.weight
    CascadeAssistant([drafter]).bind(target)  # placing the drafter: no-op here
    assert all(p is params[n][0] and p.data_ptr() == params[n][1] for n, p in target.named_parameters())


# -- bf16 target, fp32 drafters and heads: cast at bind, outputs identical to plain bf16 generate -----------


def test_bf16_target_cascade_and_hsddw_drafters_cast(pair):
    target, fp32 = pair["bf16"], pair["fp32"]
    expected = greedy(target)
    drafter = tm.noisy_copy(fp32, 0.3)
    a = CascadeAssistant([drafter, MaxGram()], settings=CascadeSettings(k_matrix=[[2, 4], [0, 4]]))
    assert greedy(target, a) == expected
    assert float_dtypes(drafter) == {torch.bfloat16} and sum(a.last_stats.accepted_per_call) > 0
    small, big = tm.noisy_copy(fp32, 0.3, seed=5), tm.noisy_copy(fp32, 0.1, seed=6)
    a = DynamicWindowAssistant(
        small, big, settings=DynamicWindowSettings(tau_init=float("inf"), tau2_init=float("inf"))
    )
    assert greedy(target, a) == expected
    assert float_dtypes(small) == float_dtypes(big) == {torch.bfloat16}


@pytest.mark.parametrize("cape", [True, False])
def test_bf16_target_glide_cast(pair, cape, free_drafts):
    target = pair["bf16"]
    glide = echo_glide(pair["fp32"])  # shares the target's embeddings
    a = GlideAssistant(
        glide, settings=GlideSettings(cape=cape), policy=Policy(cost_aware=False)
    )  # drafts at every step
    assert greedy(target, a) == greedy(target)
    assert {p.dtype for p in glide.parameters()} == {torch.bfloat16}
    assert sum(a.last_stats.accepted_per_call) > 0 or not cape  # (the echo GLIDE's chains miss on llama)


def test_bf16_target_redrafter_cast(pair, free_drafts):
    target = pair["bf16"]
    head = copy.deepcopy(fit_head(pair["fp32"], pair["name"], steps=80))
    a = ReDrafterAssistant(
        head, settings=ReDrafterSettings(beam_width=4, beam_length=5), policy=Policy(cost_aware=False)
    )
    assert greedy(target, a) == greedy(target)
    assert {p.dtype for p in head.parameters()} == {torch.bfloat16}
    assert sum(a.last_stats.accepted_per_call) > 0


def test_place_drafters_false_leaves_drafters_untouched(pair):
    target, fp32 = pair["bf16"], pair["fp32"]
    expected = greedy(target)
    drafter = tm.noisy_copy(fp32, 0.3)
    glide = echo_glide(fp32)  # fp32, sharing the bf16 target's embeddings and head
    head = copy.deepcopy(fit_head(fp32, pair["name"], steps=80))
    for assistant, module in (
        (CascadeAssistant([drafter], loading=Loading(place=False)), drafter),
        (GlideAssistant(glide, loading=Loading(place=False)), glide),
        (
            ReDrafterAssistant(
                head, settings=ReDrafterSettings(beam_width=2, beam_length=3), loading=Loading(place=False)
            ),
            head,
        ),
    ):
        before = {n: t for n, t in module.named_parameters()}
        assert greedy(target, assistant) == expected  # drafting in fp32 works, exact
        assert all(t is before[n] and t.dtype == torch.float32 for n, t in module.named_parameters())


# -- devices: reviews, K/V, cache gathers ----------------------------------------------------------------------


def test_glide_moves_the_glimpsed_kv_to_its_own_device(monkeypatch):
    """The target's cache layers may live on other devices (device_map): the cross-attention moves each
    layer's K/V to the head's device (here the head on ``meta``, the K/V on the CPU)."""
    from hf_cascade.heads.glide import attention_glide

    target = tm.llama_target()
    c = GlideConfig.from_target(
        target,
        share_target_embeddings=True,
        num_hidden_layers=1,
        intermediate_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    attn = attention_glide.GlideCrossAttention(c, 0).to(device="meta", dtype=torch.bfloat16)
    # rotary embeddings on ``meta`` (transformers 4.57's autocast guard has no meta device): same shapes
    monkeypatch.setattr(
        type(attn.rotary_emb),
        "forward",
        lambda self, q, pos: (q.new_ones(*pos.shape, q.shape[-1]), q.new_zeros(*pos.shape, q.shape[-1])),
    )
    seen = []
    original = attention_glide._repeat_kv
    monkeypatch.setattr(attention_glide, "_repeat_kv", lambda x, n: seen.append((x.device, x.dtype)) or original(x, n))
    kv = torch.randn(1, 2, 5, c.target_head_dim)  # float32, on the CPU
    x = torch.zeros(1, 3, c.hidden_size, device="meta", dtype=torch.bfloat16)
    allowed = torch.ones(1, 1, 3, 5, dtype=torch.bool, device="meta")
    out = attn(x, torch.arange(3, device="meta")[None], kv, kv, allowed)
    assert out.shape == (1, 3, c.hidden_size) and seen == [(torch.device("meta"), torch.bfloat16)] * 2


def test_rows_are_kept_on_the_ids_device():
    """Under ``device_map`` the output head may live on another device than the input embeddings (an untied head
    on the last GPU); logits processors index the logits with the ids (``repetition_penalty``), so the rows are
    kept where the ids are, as transformers' loops keep their scores (here the ids on ``meta``, the head's
    bf16 logits on the CPU): every processor sees both on one device, raw and processed rows float32 there."""
    from transformers import RepetitionPenaltyLogitsProcessor

    from hf_cascade.core.rows import TreeRows, first_blocks

    seen = []

    class Devices:
        def __call__(self, input_ids, scores):
            seen.append((input_ids.device, scores.device))
            return scores

    processors = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5), Devices()])
    tree = TokenTree(torch.tensor([5, 6, 7]), torch.tensor([-1, 0, -1]))
    seq = torch.tensor([1, 5, 9], device="meta")
    weight = torch.randn(tm.VOCAB, 8)
    head = lambda h: (h @ weight.T).to(torch.bfloat16)  # noqa: E731  (on the CPU)
    built = [
        TreeRows(tree, seq, processors, hidden=torch.randn(4, 8), head=head, block_rows=2),
        TreeRows(tree, seq, processors, raw=torch.randn(4, tm.VOCAB, dtype=torch.bfloat16)),
    ]
    first = [TreeRows(tree, seq, processors, hidden=torch.randn(4, 8), head=head, block_rows=2) for _ in range(2)]
    first_blocks(first, torch.randn(2, 4, 8), lambda m: (head, None), greedy=False)  # a batch's first blocks
    for rows in built + first:
        for r in (0, 1, 3):
            assert rows.raw(r).device == rows[r].device == seq.device, r
            assert rows.raw(r).dtype == rows[r].dtype == torch.float32
    assert seen and set(seen) == {(seq.device, seq.device)}


class OnHeadGPU(torch.Tensor):
    """A CPU tensor standing for one on the output head's GPU of a target split over two (``device_map``, an untied
    head on the last GPU): what is computed from it stays there (the same subclass); ``.to(device)``, ``.cpu()`` or
    ``copy_`` into another tensor is a copy off that GPU (``crossed["moved"]``), a host read of its values (``tolist``,
    ``item``, ...) a read (``crossed["read"]``), each logged as ``(shape, dtype)``."""

    crossed: dict[str, list] = {"moved": [], "read": []}
    READS = {"tolist", "item", "numpy", "__int__", "__float__", "__bool__", "__index__"}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
            source = args[0] if args and isinstance(args[0], cls) else None
            moves = name == "cpu" or (
                name == "to"
                and any(isinstance(a, (str, torch.device, torch.Tensor)) for a in (*args[1:], kwargs.get("device")))
            )
            if name == "copy_" and not isinstance(args[0], cls):
                source, moves = args[1], True
            if source is not None and (moves or name in cls.READS):
                cls.crossed["moved" if moves else "read"].append((tuple(source.shape), source.dtype))
                return out.as_subclass(torch.Tensor) if isinstance(out, cls) else out  # (a no-op move: a view)
            if name == "copy_":
                return out
            return torch.utils._pytree.tree_map(lambda t: t.as_subclass(cls) if type(t) is torch.Tensor else t, out)


@pytest.fixture
def head_on_gpu1(monkeypatch):
    """A Gemma3 target whose head outputs live on "another GPU" (:class:`OnHeadGPU`), verified with the model's own
    kernels (no CPU backend); yields the target and the log of what crossed from there."""
    from hf_cascade import backends

    monkeypatch.setenv(backends.ENV, "0")
    target = tm.gemma3_target()
    assert target.get_output_embeddings().weight is not target.get_input_embeddings().weight  # an untied head
    crossed = {"moved": [], "read": []}
    monkeypatch.setattr(OnHeadGPU, "crossed", crossed)
    hook = target.get_output_embeddings().register_forward_hook(lambda m, a, out: out.as_subclass(OnHeadGPU))
    yield target, crossed
    hook.remove()


def _float_rows(log: list, vocab: int) -> list:
    return [(shape, dtype) for shape, dtype in log if dtype.is_floating_point and shape and shape[-1] == vocab]


@pytest.mark.parametrize(
    "batch, full_forward, every_row, tree",
    [
        (1, False, True, False),
        (1, False, False, True),
        (1, True, True, True),
        (2, False, True, False),
        (2, False, False, False),
        (2, True, True, False),
    ],
    ids=["chain", "tree-blocks_of_4", "model_logits-tree", "batch-chain", "batch-blocks_of_4", "batch-model_logits"],
)
def test_greedy_rows_cross_devices_as_argmax_ids_only(head_on_gpu1, batch, full_forward, every_row, tree, monkeypatch):
    """Greedy acceptance without processors reads argmaxes only: taken where the head's rows are, only the ids
    cross (to the host, as acceptance reads them anyway; no ``[k, V]`` float32 block is copied to the ids' device,
    1 MB a row at Gemma 3's vocabulary): through the core's head as through the model's own logits (a head the core
    does not reproduce), every row in one head call (accelerators) or blocks of 4, at batch 1 and in a batch (each
    row's first block in one call). The output is plain ``generate``'s."""
    from hf_cascade.core import batch as batch_loop
    from hf_cascade.core import loop
    from hf_cascade.maxgram_tree import MaxGramTreeAssistant

    target, crossed = head_on_gpu1
    monkeypatch.setattr(placement, "DEFER_READS", every_row)  # the accelerator schedule, or the CPU's
    if full_forward:
        for module in (loop, batch_loop):
            monkeypatch.setattr(module, "checked_head", lambda *a: None)
    prompts = REPETITIVE if batch == 1 else torch.tensor([[0, 0, 1, 5, 6, 5, 6, 5], [1, 7, 8, 9, 7, 8, 9, 7]])
    kw = {} if batch == 1 else {"attention_mask": (prompts != 0).long(), "pad_token_id": 0}
    assistant = MaxGramTreeAssistant(branches=3, depth=4) if tree else CascadeAssistant([MaxGram()])
    out = target.generate(prompts, do_sample=False, max_new_tokens=NEW, assistant_model=assistant, **kw)
    assert assistant.last_stats.tokens_per_target_call > 1.2  # drafts verified and accepted
    assert not crossed["moved"], crossed["moved"][:4]  # nothing copied off the head's GPU
    assert crossed["read"] and all(d == torch.int64 and len(s) == 1 for s, d in crossed["read"]), crossed["read"]
    assert out.tolist() == target.generate(prompts, do_sample=False, max_new_tokens=NEW, **kw).tolist()


@pytest.mark.parametrize(
    "kw",
    [{"do_sample": False, "repetition_penalty": 1.5}, {"do_sample": True, "top_k": 1}],
    ids=["repetition_penalty", "sampling"],
)
def test_rows_read_in_full_still_cross_to_the_ids_device(head_on_gpu1, kw):
    """Where the rows are read in full (a processor indexes them with the ids, sampling takes their softmax), a head
    call's ``[k, V]`` rows cross to the ids' device, and the output is plain ``generate``'s (``top_k=1``: sampling
    that must give the greedy tokens)."""
    target, crossed = head_on_gpu1
    assistant = CascadeAssistant([MaxGram()], cpu_kernels=False)
    out = target.generate(REPETITIVE, max_new_tokens=NEW, assistant_model=assistant, **kw)
    assert _float_rows(crossed["moved"], tm.VOCAB), crossed
    assert out.tolist() == target.generate(REPETITIVE, max_new_tokens=NEW, **kw).tolist()


# -- attention backends and the tree mask ---------------------------------------------------------------------


def test_needs_tree_mask():
    assert not needs_tree_mask(TokenTree.chain(torch.tensor([5, 6, 7])))
    assert not needs_tree_mask(TokenTree(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)))
    assert needs_tree_mask(TokenTree(torch.tensor([5, 6, 7]), torch.tensor([-1, -1, 0])))
    assert needs_tree_mask(TokenTree(torch.tensor([5, 6]), torch.tensor([-1, -1])))


@pytest.mark.parametrize(
    "impl", ["flash_attention_2", "flash_attention_3", "paged|sdpa", "kernels-community/flash-attn", "flex_attention"]
)
def test_attention_backend_check(impl):
    model = tm.llama(seed=4)
    check_attention_backend(model, tree_shaped=True)  # eager / sdpa: fine
    model.config._attn_implementation = impl  # no kernel needed: no forward runs
    check_attention_backend(model, tree_shaped=False)  # chains: plain causal, any backend
    with pytest.raises(ValueError, match="eager or sdpa"):
        check_attention_backend(model, tree_shaped=True)


def test_flash_attention_tree_assistant_refused_before_any_forward(monkeypatch):
    model = tm.llama_target()
    model.config._attn_implementation = "flash_attention_2"
    calls = []
    monkeypatch.setattr(type(model), "forward", lambda *a, **k: calls.append(1))
    with pytest.raises(ValueError, match="eager or sdpa"):
        model.generate(REPETITIVE, do_sample=False, max_new_tokens=5, assistant_model=GlideAssistant(echo_glide(model)))
    assert calls == []


@pytest.mark.measured_costs  # the profile measured as users get it (tests/conftest.py: pinned_costs)
@pytest.mark.parametrize("kind", ["glide", "redrafter"])
def test_chain_workaround_under_flash_attention_measures_chains(kind, monkeypatch):
    """The documented workaround for flash attention (chains only: ``cape=False``, ``beam_width=1``) with the
    default ``Policy()``: its measured profile verifies chains too (no tree mask reaches the model), and outputs
    equal plain ``generate``. The backend is flash as the check reads it; the forwards run sdpa (no flash_attn
    here)."""
    from hf_cascade import measure
    from hf_cascade.core import forward
    from tests.redrafter_helpers import random_head

    target = tm.llama_target()
    plain = greedy(target, max_new_tokens=12)
    monkeypatch.setattr(measure, "_MEASURED", {})
    monkeypatch.setattr(forward, "attention_backend", lambda model: "flash_attention_2")
    masks = []
    handle = target.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: masks.append(kwargs.get("attention_mask")), with_kwargs=True
    )
    assistant = (
        GlideAssistant(echo_glide(target), settings=GlideSettings.chain())
        if kind == "glide"
        else ReDrafterAssistant(random_head(target), settings=ReDrafterSettings(beam_width=1))
    )
    try:
        assert greedy(target, assistant, max_new_tokens=12) == plain
    finally:
        handle.remove()
    assert len(measure._MEASURED) == 1  # the profile was measured
    assert masks and all(m is None for m in masks)  # chains only: no tree mask


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_tree_mask_dtype_follows_the_embeddings(pair, impl):
    target = copy.deepcopy(pair["bf16"])
    target.set_attn_implementation(impl)
    tree = TokenTree(torch.tensor([5, 6, 7, 8]), torch.tensor([-1, 0, -1, 2]))
    assert mask_device_dtype(target) == (torch.device("cpu"), torch.bfloat16)
    cache = DynamicCache()
    with torch.no_grad():
        target(input_ids=torch.arange(6)[None], past_key_values=cache, use_cache=True)
    mask = _tree_inputs(target, cache, 6, tree, 3)["attention_mask"]  # what verify_tree passes
    for m in mask.values() if isinstance(mask, dict) else [mask]:
        assert m.dtype == torch.bfloat16 and m.shape == (1, 1, 5, 11)
        assert float(m.min()) == torch.finfo(torch.bfloat16).min
    glide = echo_glide(pair["fp32"])
    assert greedy(target, GlideAssistant(glide)) == greedy(target)  # bf16 tree verification, exact


# -- clocks: synchronised before reading --------------------------------------------------------------------


def test_synchronize_is_a_noop_on_cpu(monkeypatch):
    """On a CPU (and for a CPU module, and for ``None`` where no accelerator is available) no accelerator's
    ``synchronize`` is called; on a CUDA device it is."""
    calls = []
    for backend in ("cuda", "xpu", "mps"):
        if hasattr(torch, backend):
            monkeypatch.setattr(
                getattr(torch, backend), "synchronize", lambda *a, backend=backend: calls.append(backend), raising=False
            )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    synchronize("cpu")
    synchronize(torch.device("cpu"))
    synchronize(tm.llama(seed=5))
    synchronize(None)
    assert calls == []
    synchronize(torch.device("cuda", 0))  # the rule does call it where there is a device to wait for
    assert calls == ["cuda"]


def test_accelerators_of_a_module():
    from types import SimpleNamespace

    model = tm.llama(seed=5)
    assert placement.accelerators(model) == ()  # CPU: nothing to wait for
    offloaded = copy.deepcopy(model).to("meta")  # weights offloaded, run on cuda:0
    offloaded.get_input_embeddings()._hf_hook = SimpleNamespace(execution_device=0)
    assert placement.accelerators(offloaded) == (torch.device("cuda", 0),)


def test_phase_timer_synchronises_accelerators_only(monkeypatch):
    """``last_stats.phase_seconds`` on an accelerator, where asked for (``synchronize=True``): the target's devices
    are synchronised before each clock read of a phase (else a phase is timed at its kernels' launch); on a CPU
    nothing is called, and by default nothing either (issue 72)."""
    from hf_cascade.core.stats import GenerationStats, PhaseTimer

    calls = []
    monkeypatch.setattr(placement, "synchronize", lambda device=None: calls.append(device))
    stats, target = GenerationStats(), tm.llama(seed=5)
    with PhaseTimer(stats, target, synchronize=True)("draft"):
        pass
    assert calls == [] and "draft" in stats.phase_seconds  # CPU target: no call
    two = (torch.device("cuda", 0), torch.device("cuda", 1))  # a fake target over two GPUs
    monkeypatch.setattr(placement, "accelerators", lambda module: two)
    with PhaseTimer(stats, target)("draft"):
        pass
    assert calls == []  # not asked for: no call
    with PhaseTimer(stats, target, synchronize=True)("verify"):
        assert calls == list(two)  # before the first clock read
    assert calls == list(two) * 2 and "verify" in stats.phase_seconds  # ... and before the second


@pytest.mark.parametrize("kind", ["glide", "cascade"])
def test_decoding_phases_synchronise_the_targets_accelerator(kind, monkeypatch):
    calls = []
    monkeypatch.setattr(placement, "synchronize", lambda device=None: calls.append(device))
    target = tm.llama_target()
    plain = greedy(target, max_new_tokens=12)
    assert calls == []
    monkeypatch.setattr(
        placement, "accelerators", lambda module: (torch.device("cuda", 0),) if module is target else ()
    )
    synced = Policy(sync_phases=True)  # asked for (default: no phase waits)
    assistant = (
        GlideAssistant(echo_glide(target), policy=synced)
        if kind == "glide"
        else CascadeAssistant(
            [tm.noisy_copy(target, 0.3), MaxGram()], settings=CascadeSettings(k_matrix=[[2, 4], [0, 4]]), policy=synced
        )
    )
    assert greedy(target, assistant, max_new_tokens=12) == plain
    timed = assistant.last_stats.phase_seconds
    assert {"prefill", "draft", "verify", "accept", "update"} <= set(timed)
    phases = [c for c in calls if c.type != "cpu"]  # GLIDE's timed drafts wait on its own (CPU) device too
    assert phases and set(phases) == {torch.device("cuda", 0)} and len(phases) % 2 == 0


def test_timed_forwards_synchronise(monkeypatch):
    from hf_cascade.drafters import neural

    calls = []
    monkeypatch.setattr(neural, "synchronize", lambda device=None: calls.append(device))
    target = tm.llama_target()
    a = CascadeAssistant(
        [tm.noisy_copy(target, 0.3), MaxGram()],
        settings=CascadeSettings(k_matrix=[[2, 4], [0, 4]]),
        policy=Policy(lookup=False),
    )  # reviews
    out = greedy(target, a, max_new_tokens=12)
    assert out == greedy(target, max_new_tokens=12)
    assert calls and len(calls) % 2 == 0 and set(calls) == {torch.device("cpu")}  # around each review forward
    calls.clear()
    level = NeuralLevel(target, tm.VOCAB, LogitsProcessorList(), LevelStats("t"))
    level.scores(REPETITIVE[0], 3)
    assert calls == []  # untimed: no synchronisation
    level.scores(REPETITIVE[0], 3, timed=True)
    assert len(calls) == 2


@pytest.mark.measured_costs
def test_verify_cost_measurement_synchronises_and_default_is_measured_per_device(monkeypatch):
    from hf_cascade import measure
    from hf_cascade.core.payoff import VerifyCost

    calls = []
    monkeypatch.setattr(placement, "synchronize", lambda device=None: calls.append(device))
    model = tm.gemma3_target()
    cost = measure_verify_cost(model, prompt_len=8, steps=2, repeats=1, grid=(0, 2, 4))
    assert len(cost.relative) == 5 and cost.relative[0] == 1.0 and list(cost.relative) == sorted(cost.relative)
    assert calls and len(calls) % 2 == 0  # before and after every timed run
    monkeypatch.setattr(measure, "_MEASURED", {})
    monkeypatch.setattr(measure, "_ROUNDS", {})
    measured = []
    monkeypatch.setattr(
        measure,
        "_rounds",
        lambda m, rounds, **kw: (
            measured.append({"rounds": rounds, **kw}) or [{n: 1 + 0.05 * n for n in measure.QUICK_GRID}] * rounds
        ),
    )
    first = measure.bound_verify_cost(Policy(), model)
    assert first.relative == pytest.approx([1 + 0.05 * n for n in range(25)])
    assert measure.bound_verify_cost(Policy(), model) is first
    assert len(measured) == 1 and measured[0]["grid"] == measure.QUICK_GRID  # measured once per device kind
    assert measured[0]["rounds"] == 1  # nothing kept (conftest): one
    assert [p["rounds"] for p in measure.measured_profiles()] == [{"measured": 1, "kept": 0}]
    given = Policy(verify_cost=VerifyCost.reference())
    assert measure.bound_verify_cost(given, model) == VerifyCost.reference()  # a given profile: not measured
    assert measure.bound_verify_cost(Policy(cost_aware=False), model) is None  # no cost rule: nothing measured
    assert len(measured) == 1
