"""GPU bugs of issue 55 (CPU tests of the same rules: tests/test_devices.py, tests/test_parity.py):

* flash attention with the documented chain workaround (``GlideSettings.chain()``,
  ``ReDrafterSettings(beam_width=1)``) and the verification profile measured, not pinned: its measurement
  verifies chains, outputs equal plain ``generate`` (needs ``flash_attn``);
* a target split over two GPUs with an untied head on ``cuda:1``: the rows of logits are read on the ids' device
  (``cuda:0``), so ``repetition_penalty`` works, at batch 1 and in a batch, and greedy acceptance without processors
  copies only argmax ids off ``cuda:1`` (needs two GPUs; the CPU test of the rule: tests/test_devices.py);
* the phase timer behind ``last_stats`` synchronises the target's GPU before reading the clock;
* the bf16 tie rule (``hf_cascade.parity``) on a CUDA target.

Skipped without CUDA (tests/cuda/conftest.py marks them ``cuda``).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch.overrides import TorchFunctionMode
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

from hf_cascade import (
    CascadeAssistant,
    GlideAssistant,
    GlideSettings,
    MaxGram,
    ReDrafterAssistant,
    ReDrafterSettings,
)
from tests.contract_registry import detached_copy
from tests.test_contract import REPETITIVE, base_kit, fresh_kit
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

HAS_FLASH = importlib.util.find_spec("flash_attn") is not None
TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2


def greedy(target, assistant=None, prompt=REPETITIVE, **kw):
    kw.setdefault("max_new_tokens", 20)
    device = target.get_input_embeddings().weight.device
    return target.generate(prompt.to(device), do_sample=False, assistant_model=assistant, **kw).tolist()


# -- flash attention: the chain workaround with the measured verification profile --------------------------


@pytest.mark.skipif(not HAS_FLASH, reason="needs flash_attn")
@pytest.mark.measured_costs  # the profile measured as users get it (tests/conftest.py)
@pytest.mark.parametrize("kind", ["glide", "redrafter"])
def test_flash_attention_chain_workaround_measures_chains(kind, monkeypatch):
    from hf_cascade import measure

    target = detached_copy(base_kit("gemma3").target).to("cuda:0", torch.bfloat16)
    target.set_attn_implementation("flash_attention_2")
    monkeypatch.setattr(measure, "_MEASURED", {})
    kit = fresh_kit("gemma3", target)
    assistant = (
        GlideAssistant(kit.glide, settings=GlideSettings.chain())
        if kind == "glide"
        else ReDrafterAssistant(kit.head, settings=ReDrafterSettings(beam_width=1))
    )
    for kw in ({"max_new_tokens": 20}, {"max_new_tokens": 16, "repetition_penalty": 1.5}):
        assert greedy(target, assistant, **kw) == greedy(target, **kw), kw
    assert len(measure._MEASURED) == 1 and next(iter(measure._MEASURED))[-1] == "chains"


# -- an untied head on another GPU: processors see logits on the ids' device ------------------------------------


@pytest.fixture(scope="module")
def split_head():
    """Gemma3 (bf16, untied head) dispatched by accelerate: embeddings and layers on ``cuda:0``, final norm and
    head on ``cuda:1``."""
    from accelerate import dispatch_model

    model = detached_copy(base_kit("gemma3").target).to(torch.bfloat16)
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight
    device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers": 0, "model.norm": 1, "lm_head": 1}
    if hasattr(model.model, "rotary_emb_local"):
        device_map["model.rotary_emb_local"] = 0
    return dispatch_model(model, device_map=device_map, main_device=0)


@pytest.mark.skipif(not TWO_GPUS, reason="needs two GPUs")
def test_rows_on_the_ids_device_across_two_gpus():
    from hf_cascade.core import TokenTree
    from hf_cascade.core.rows import TreeRows

    head = torch.nn.Linear(8, 32, bias=False).to("cuda:1", torch.bfloat16)
    tree = TokenTree(torch.tensor([5, 6, 7]), torch.tensor([-1, 0, -1]))
    seq = torch.tensor([1, 5, 9], device="cuda:0")
    processors = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5)])
    rows = TreeRows(
        tree,
        seq,
        processors,
        hidden=torch.randn(4, 8, device="cuda:1", dtype=torch.bfloat16),
        head=lambda h: head(h),
        block_rows=2,
    )
    for r in range(4):
        assert rows[r].device == rows.raw(r).device == seq.device and rows[r].dtype == torch.float32


class _Crossings(TorchFunctionMode):
    """Logs every copy of a tensor from one CUDA device to another (``.to``, ``copy_``, ...): ``(shape, dtype)``."""

    def __init__(self):
        super().__init__()
        self.moved: list[tuple[tuple, torch.dtype]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        copy = getattr(func, "__name__", "") == "copy_"
        source, dest = (args[1], args[0]) if copy else (args[0] if args else None, out)
        if (
            isinstance(source, torch.Tensor)
            and isinstance(dest, torch.Tensor)
            and source.device != dest.device
            and source.device.type == dest.device.type == "cuda"
        ):
            self.moved.append((tuple(source.shape), source.dtype))
        return out


@pytest.mark.skipif(not TWO_GPUS, reason="needs two GPUs")
def test_greedy_rows_cross_gpus_as_argmax_ids_only():
    """The head's rows on ``cuda:1``, the ids on ``cuda:0``: greedy acceptance without processors copies no row
    between the GPUs (each block's argmax ids go to the host from ``cuda:1``) and accepts what the full rows give,
    at batch 1 (every row in one head call, or blocks of 2) and for a batch's first blocks; with a processor the
    ``[k, V]`` rows cross."""
    from hf_cascade.core import TokenTree, greedy_tree_accept
    from hf_cascade.core.rows import TreeRows, first_blocks

    def head(h):  # [k, 8] -> [k, 32]: no sum, the same values in any block
        return torch.cat([h, -h, 2 * h, -2 * h], dim=-1)

    seq = torch.tensor([1, 5, 9], device="cuda:0")
    hidden = torch.randn(4, 8, device="cuda:1", dtype=torch.bfloat16)
    full = head(hidden).float()  # every row, where the head is
    best = full.argmax(dim=-1).tolist()
    tree = TokenTree(torch.tensor([best[0], best[1], (best[0] + 1) % 32]), torch.tensor([-1, 0, -1]))
    expected = greedy_tree_accept(tree, full)
    assert expected.nodes == (0, 1)  # nodes 0 and 1 accepted
    for block_rows in (None, 2):
        rows = TreeRows(tree, seq, LogitsProcessorList(), hidden=hidden, head=head, block_rows=block_rows)
        with _Crossings() as crossings:
            got = greedy_tree_accept(tree, rows)
        assert crossings.moved == [] and (got.nodes, got.bonus) == (expected.nodes, expected.bonus), block_rows
    rows = [TreeRows(tree, seq, LogitsProcessorList(), hidden=hidden, head=head, block_rows=2) for _ in range(2)]
    with _Crossings() as crossings:
        first_blocks(rows, torch.stack([hidden, hidden]), lambda m: (head, None))
        got = [greedy_tree_accept(tree, r) for r in rows]
    assert crossings.moved == [] and all((g.nodes, g.bonus) == (expected.nodes, expected.bonus) for g in got)
    processors = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5)])
    rows = TreeRows(tree, seq, processors, hidden=hidden, head=head, block_rows=None)
    with _Crossings() as crossings:
        greedy_tree_accept(tree, rows)
    assert crossings.moved == [((4, 32), torch.bfloat16)]  # one copy of the head call's rows


@pytest.mark.skipif(not TWO_GPUS, reason="needs two GPUs")
@pytest.mark.parametrize("processors", [{}, {"repetition_penalty": 1.5}], ids=["greedy", "repetition_penalty"])
@pytest.mark.parametrize("name", ["glide_cape", "redrafter", "drafter+maxgram"])
def test_head_on_another_gpu(name, processors, split_head, free_drafts):
    kit = fresh_kit("gemma3", split_head)
    assistant = {
        "glide_cape": lambda: GlideAssistant(kit.glide),
        "redrafter": lambda: ReDrafterAssistant(kit.head, settings=ReDrafterSettings(beam_width=4, beam_length=4)),
        "drafter+maxgram": lambda: CascadeAssistant([kit.drafter, MaxGram()]),
    }[name]()
    kw = {"max_new_tokens": 16, **processors}
    assert greedy(split_head, assistant, **kw) == greedy(split_head, **kw)
    prompts = torch.tensor([[0, 0, 1, 5, 6, 5, 6, 5], [1, 7, 8, 9, 7, 8, 9, 7]], device="cuda:0")  # left-padded
    kw.update(attention_mask=(prompts != 0).long(), pad_token_id=0)
    batched = split_head.generate(prompts, do_sample=False, assistant_model=assistant, **kw)
    assert batched.tolist() == split_head.generate(prompts, do_sample=False, **kw).tolist()


# -- the phase timer waits for the GPU ------------------------------------------------------------------------


def test_phase_timer_synchronises_the_gpu():
    """A phase that queues GPU work is timed until that work is done (not at its launch)."""
    from hf_cascade.core.stats import GenerationStats, PhaseTimer

    target = detached_copy(base_kit("gemma3").target).to("cuda:0")
    cycles = 200_000_000
    torch.cuda._sleep(cycles // 10)  # warm-up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    queued = start.elapsed_time(end) / 1000  # seconds the GPU spent
    stats = GenerationStats()
    with PhaseTimer(stats, target)("verify"):
        torch.cuda._sleep(cycles)  # queued: returns at once
    assert stats.phase_seconds["verify"] >= 0.5 * queued
    assistant = CascadeAssistant([MaxGram()])
    greedy(target, assistant)
    assert {"prefill", "draft", "verify", "accept", "update"} <= set(assistant.last_stats.phase_seconds)


# -- the bf16 tie rule on a CUDA target --------------------------------------------------------------------------


def test_divergence_on_a_cuda_bf16_target():
    from hf_cascade.parity import divergence

    target = detached_copy(base_kit("gemma3").target).to("cuda:0", torch.bfloat16)
    plain = greedy(target)[0]
    assert divergence(target, plain, plain) is None
    p = REPETITIVE.shape[1] + 2
    with torch.no_grad():
        logits = target(input_ids=torch.tensor([plain[:p]], device="cuda:0")).logits[0, -1].float()
    last = int(logits.argmin())
    d = divergence(target, plain, plain[:p] + [last])
    assert d.position == p and d.got == last and not d.tie
