"""Batched speculative decoding (issue 27, :mod:`hf_cascade.core.batch`): a left-padded batch
``target.generate(input_ids [B, P], attention_mask=..., assistant_model=a)`` gives, row for row, what PLAIN
batched ``generate`` of the same target gives on the same padded batch, in the same dtype.

(1) **greedy parity** -- every assistant of the contract's :data:`REGISTRY` on the target settings Llama
    (sdpa), Gemma3 (sliding-window layers; sdpa, eager, a bf16 target given fp32 drafters, a target offloaded
    by accelerate), ``B = 4`` rows of 1, 2, 9 and 25 tokens: an EOS inside a draft of one row (rows finish at
    different steps), ``max_new_tokens`` ending inside drafts, ``max_new_tokens=1``, a repetition penalty
    (transformers gives it each row's padding); a padded batch of one row; two rows, one finishing at once;
(2) **statistics** -- a :class:`BatchStats` with one row's statistics per row: the row's tokens, its calls
    (a row takes part in every verification until it finishes, then in none: ``rows_per_call``), the widest
    draft per call; fewer batched calls than plain decoding's steps on repetitive rows;
(3) **no state leak** -- a batch then a single prompt, a single prompt then a batch, with one assistant: the
    second call gives what a fresh assistant gives (outputs and statistics, on a deterministic clock);
(4) **exact sampling per row** -- tests/test_batch_sampling.py;
(5) **errors**, (6) ``return_dict_in_generate`` and batch-indexed logits processors -- tests/test_batch_api.py;
(7) ``pipeline(..., batch_size=4)`` with an
    assistant returns exactly what it returns without; (8) the real Gemma-3-270M (``real_model``).

Drafted steps, where a test asserts on them, do not depend on wall time: :func:`free_drafts`, a flat
verification profile for GLIDE and ReDrafter (:func:`flat_profile`) and the batch's draft gate held open
(``open_gate``, tests/conftest.py); the gate's own rules (refused steps, its width, only the lagging rows
drafting) keep parity too: tests/test_batch_gate.py.

The checks are functions of a target: tests/cuda/test_cuda_batch.py runs them on a GPU.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch
from transformers import pipeline

import hf_cascade  # noqa: F401  (installs the generate() hook)
from hf_cascade import CascadeAssistant, GlideAssistant, MaxGram, ReDrafterAssistant
from hf_cascade.core.batch import prefill_by_row
from hf_cascade.core.payoff import CostModel, VerifyCost
from hf_cascade.core.stats import BatchStats
from tests import tiny_models as tm
from tests.contract_registry import REGISTRY, SETTINGS, STATEFUL, base_kit, fresh_kit, input_device, setting_target
from tests.test_contract import ASCENDING, REPETITIVE, FakeClock, _eos_inside_drafts
from tests.test_contract import assert_no_state_leak as contract_no_state_leak
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)


def left_pad(rows: list[list[int]], extra: int = 0, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` ``[B, P]`` of ``rows`` left-padded with ``tm.PAD`` (``extra`` more
    padding columns on every row), as a tokenizer with ``padding_side="left"`` gives them."""
    P = max(map(len, rows)) + extra
    input_ids = torch.tensor([[tm.PAD] * (P - len(r)) + list(r) for r in rows], device=device)
    mask = torch.tensor([[0] * (P - len(r)) + [1] * len(r) for r in rows], device=device)
    return input_ids, mask


def stop_ids(target, kw: dict) -> set[int]:
    eos = kw.get("eos_token_id", target.generation_config.eos_token_id)
    return set() if eos is None else {int(t) for t in torch.as_tensor(eos).flatten().tolist()}


def emitted(expected: list[list[int]], P: int, eos: set[int]) -> list[int]:
    """Tokens each row of a plain batched output generated, up to its stop (its EOS included): a row that
    never stops on an EOS runs to the end (what comes after a stop is padding)."""
    out = []
    for row in expected:
        gen = row[P:]
        out.append(next((i + 1 for i, t in enumerate(gen) if t in eos), len(gen)))
    return out


def assert_batch_stats(stats, expected: list[list[int]], P: int, eos: set[int]) -> None:
    """One :class:`GenerationStats` per row with that row's tokens; a row takes part in every batched call
    until it finishes, then in none; each call is as wide as its widest draft plus the root."""
    assert isinstance(stats, BatchStats), type(stats)
    assert len(stats.rows) == len(expected)
    assert [r.new_tokens for r in stats.rows] == emitted(expected, P, eos)
    assert stats.new_tokens == sum(emitted(expected, P, eos))
    calls = [r.target_calls for r in stats.rows]
    assert stats.target_calls == max(calls) == len(stats.rows_per_call) == len(stats.width_per_call)
    assert stats.rows_per_call == [sum(c > k for c in calls) for k in range(stats.target_calls)]
    assert stats.width_per_call == [
        1 + max(r.draft_len_per_call[k] for r in stats.rows if r.target_calls > k) for k in range(stats.target_calls)
    ]
    assert stats.prefill_calls == prefill_forwards(expected, P)


def prefill_forwards(expected: list[list[int]], P: int) -> int:
    """The target forwards over a batch's prompts: one over the padded block, or one per row with more than one
    prompt token where padding is at least half of it (:func:`hf_cascade.core.batch.prefill_by_row`)."""
    lengths = [len([t for t in row[:P] if t != tm.PAD]) - 1 for row in expected]
    if P <= 1:
        return 0
    return sum(n > 0 for n in lengths) if prefill_by_row(lengths, P - 1) else 1


# -- (1) greedy parity ------------------------------------------------------------------------------------

REP = REPETITIVE[0].tolist()  # 9 tokens: drafts get accepted
LONG = [1] + [30 + i % 7 for i in range(24)]  # 25 tokens
ROWS = [[9], [1, 40], REP, LONG]  # B = 4: 1, 2, 9 and 25 tokens


def _finishes_at_once(target) -> tuple[list[list[int]], int]:
    """Two rows and an EOS: the second row's first token (so it finishes at once), one the first row (REP) does
    not emit first."""
    device = input_device(target)
    for other in ([9], [1, 40], [17, 4], [3], [60, 61, 62]):
        input_ids, mask = left_pad([REP, other], device=device)
        out = target.generate(input_ids, attention_mask=mask, do_sample=False, max_new_tokens=1, eos_token_id=None)
        first = out[:, -1].tolist()
        if first[1] != first[0]:
            return [REP, other], first[1]
    raise AssertionError("no second row whose first token differs from the first row's")


def batch_cases(target, more: bool = True) -> list[tuple[str, tuple, dict, list]]:
    """``(case, (input_ids, attention_mask), generate kwargs, plain batched generate's output)`` on ``target``:
    the ``B = 4`` cases, and with ``more`` a repetition penalty, one padded row, two rows one finishing at once."""
    device = input_device(target)
    eos = _eos_inside_drafts(target)  # emitted on REP, inside Max-Gram's drafts
    four = left_pad(ROWS, device=device)
    cases = [
        ("max_new_tokens_13", four, {"max_new_tokens": 13}),  # ends inside the repetitive rows' drafts
        ("eos_in_draft", four, {"max_new_tokens": 16, "eos_token_id": eos}),
        ("max_new_tokens_5", four, {"max_new_tokens": 5}),
        ("max_new_tokens_1", four, {"max_new_tokens": 1}),
    ]
    if more:
        two, first = _finishes_at_once(target)
        cases += [
            ("repetition_penalty", four, {"max_new_tokens": 10, "repetition_penalty": 1.5}),
            ("one_padded_row", left_pad([REP], extra=3, device=device), {"max_new_tokens": 10}),
            ("one_row_finishes_at_once", left_pad(two, device=device), {"max_new_tokens": 10, "eos_token_id": first}),
        ]
    return [
        (name, batch, kw, target.generate(batch[0], attention_mask=batch[1], do_sample=False, **kw).tolist())
        for name, batch, kw in cases
    ]


def assert_batch_parity(target, assistant, cases) -> None:
    """Every case gives plain batched ``generate``'s tokens (the same assistant throughout), with one row's
    statistics per row; drafts were accepted."""
    accepted = 0
    for case, (input_ids, mask), kw, expected in cases:
        got = target.generate(input_ids, attention_mask=mask, do_sample=False, assistant_model=assistant, **kw)
        assert got.tolist() == expected, (case, kw)
        stats = assistant.last_stats
        assert_batch_stats(stats, expected, input_ids.shape[1], stop_ids(target, kw))
        accepted += sum(sum(r.accepted_per_call) for r in stats.rows)
    assert accepted > 0  # drafts were accepted


BATCH_SETTINGS = ["llama-sdpa", "gemma3-sdpa", "gemma3-eager", "gemma3-bf16", "gemma3-offload"]
#: the settings that also run the cases beyond ``B = 4`` (the others: attention backends and dtypes of the same loop)
MORE_CASES = ["llama-sdpa", "gemma3-sdpa"]
_CASES: dict = {}


def setting_cases(setting: str):
    if setting not in _CASES:
        target = setting_target(setting)
        target.generation_config.pad_token_id = tm.PAD
        _CASES[setting] = batch_cases(target, more=setting in MORE_CASES)
    return _CASES[setting]


@pytest.mark.parametrize("setting", MORE_CASES)
def test_batch_cases_are_meaningful(setting, free_drafts, open_gate, monkeypatch):
    """The cases test what they say: rows finish at different steps, at an EOS that a row accepted inside a
    draft (its accepted path was cut there); one row of two finishes at once; the penalty changes the output.
    The cascade's lengths come from its levels' measured costs: on a deterministic clock here (under CI's load,
    wall time may rightly keep the draft that reaches the EOS short)."""
    out = {case: (batch, kw, expected) for case, batch, kw, expected in setting_cases(setting)}
    (input_ids, mask), kw, expected = out["eos_in_draft"]
    n = emitted(expected, input_ids.shape[1], {kw["eos_token_id"]})
    assert min(n) < 16 and len(set(n)) > 1, n  # rows stop at different steps
    assert any(row[input_ids.shape[1] + k - 1] == kw["eos_token_id"] for row, k in zip(expected, n) if k < 16)
    target = setting_target(setting)
    kit = fresh_kit(SETTINGS[setting][0], target)  # Max-Gram's lengths from fixed costs, not this machine's
    a = CascadeAssistant([kit.drafter, MaxGram(cost=CostModel(measure=False))])
    with monkeypatch.context() as m:
        m.setattr(time, "perf_counter", FakeClock())
        target.generate(input_ids, attention_mask=mask, do_sample=False, assistant_model=a, **kw)
    assert any(len(r.accepted_paths[-1]) > r.accepted_per_call[-1] for r in a.last_stats.rows)  # cut at the EOS
    (input_ids, _), kw, expected = out["one_row_finishes_at_once"]
    P = input_ids.shape[1]
    assert emitted(expected, P, {kw["eos_token_id"]})[1] == 1 < len(expected[0]) - P
    (input_ids, mask), kw, penalized = out["repetition_penalty"]
    free = target.generate(input_ids, attention_mask=mask, do_sample=False, max_new_tokens=kw["max_new_tokens"])
    assert free.tolist() != penalized


def flat_profile(assistant):
    """GLIDE and ReDrafter measure the target's verification profile when they bind to it (the default
    ``Policy()``); a profile measured on a tiny model under load may keep them from drafting (the contract's CI
    notes). Here they run the budget's path with a flat profile: they draft deterministically (with
    :func:`free_drafts`), nothing is measured."""
    if isinstance(assistant, (GlideAssistant, ReDrafterAssistant)) and assistant.policy.cost_aware:
        assistant.policy = replace(assistant.policy, verify_cost=VerifyCost.flat())
    return assistant


def registry_assistant(name: str, kit):
    return flat_profile(REGISTRY[name](kit))


@pytest.mark.parametrize("setting", BATCH_SETTINGS)
@pytest.mark.parametrize("name", list(REGISTRY))
def test_greedy_parity(name, setting, free_drafts, open_gate):
    # free_drafts and a flat profile: parity must be shown on drafted steps (see test_contract.test_greedy_parity)
    cases = setting_cases(setting)
    target = setting_target(setting)
    assistant = registry_assistant(name, fresh_kit(SETTINGS[setting][0], target))
    assert_batch_parity(target, assistant, cases)


@pytest.mark.parametrize("setting", MORE_CASES)
@pytest.mark.parametrize("name", ["drafter+maxgram", "glide"])
def test_prefill_ways_agree(name, setting, free_drafts, open_gate, monkeypatch):
    """The B = 4 cases prefill row by row (padding is most of their block: rows of 1, 2, 9 and 25 tokens); held
    to the padded forward they give the same rows, and the same as plain batched ``generate``. GLIDE reads the
    target's cache: its rows' K/V from either prefill."""
    from hf_cascade.core import batch

    cases = [c for c in setting_cases(setting) if c[1][0].shape[0] == 4]
    lengths = [int(n) - 1 for n in cases[0][1][1].sum(1).tolist()]
    assert prefill_by_row(lengths, cases[0][1][0].shape[1] - 1)
    target = setting_target(setting)
    kit = fresh_kit(SETTINGS[setting][0], target)
    assert_batch_parity(target, registry_assistant(name, kit), cases)
    monkeypatch.setattr(batch, "prefill_by_row", lambda lengths, width: False)
    for case, (input_ids, mask), kw, expected in cases:
        a = registry_assistant(name, kit)
        got = target.generate(input_ids, attention_mask=mask, do_sample=False, assistant_model=a, **kw)
        assert got.tolist() == expected, case
        assert a.last_stats.prefill_calls == 1


def test_prefill_by_row_rule():
    """Row by row where padding is at least half of the padded block, never for one row."""
    assert prefill_by_row([0, 1, 8, 24], 24)  # 33 of 96 positions are prompt tokens
    assert prefill_by_row([12, 12], 24)  # exactly half
    assert not prefill_by_row([13, 12], 24)
    assert not prefill_by_row([20, 24, 24, 3], 24)
    assert not prefill_by_row([3], 24)


# -- (2) statistics --------------------------------------------------------------------------------------


def test_batch_stats_show_speculation(open_gate):
    """Repetitive rows: every row's tokens in fewer batched calls than plain decoding's steps; a row that
    stops early leaves the batch (later calls verify the others only)."""
    target = base_kit("llama").target
    rows = [REP, [1, 5, 6, 5, 6, 5, 6], [1, 30, 31, 32, 30, 31, 32, 30, 31, 32, 30], [9, 5, 6, 7]]
    input_ids, mask = left_pad(rows)
    new = 24
    plain = target.generate(input_ids, attention_mask=mask, do_sample=False, max_new_tokens=new, eos_token_id=None)
    a = CascadeAssistant([MaxGram()])
    out = target.generate(
        input_ids, attention_mask=mask, do_sample=False, max_new_tokens=new, eos_token_id=None, assistant_model=a
    )
    assert out.tolist() == plain.tolist()
    stats = a.last_stats
    assert_batch_stats(stats, plain.tolist(), input_ids.shape[1], set())
    assert [r.new_tokens for r in stats.rows] == [new] * 4
    assert stats.target_calls < new  # plain: one forward per token
    assert all(r.target_calls < new for r in stats.rows)
    assert stats.tokens_per_target_call > 4
    assert stats.to_dict()["rows"][0]["new_tokens"] == new
    # rows stop on their own: the row that emits the EOS first leaves, the others go on
    eos = plain[1, input_ids.shape[1] + 3].item()
    plain = target.generate(input_ids, attention_mask=mask, do_sample=False, max_new_tokens=new, eos_token_id=eos)
    out = target.generate(
        input_ids, attention_mask=mask, do_sample=False, max_new_tokens=new, eos_token_id=eos, assistant_model=a
    )
    assert out.tolist() == plain.tolist()
    stats = a.last_stats
    assert_batch_stats(stats, plain.tolist(), input_ids.shape[1], {eos})
    n = [r.new_tokens for r in stats.rows]
    assert n[1] <= 4 < max(n), n
    assert stats.rows_per_call[0] == 4 > stats.rows_per_call[-1]
    assert stats.rows[1].target_calls < stats.target_calls


def test_compaction_keeps_parity(open_gate):
    """Long runs of ragged rows: padding and holes pile up, the cache is compacted, outputs still equal plain."""
    target = base_kit("gemma3").target
    input_ids, mask = left_pad(ROWS)
    plain = target.generate(input_ids, attention_mask=mask, do_sample=False, max_new_tokens=32, eos_token_id=None)
    a = CascadeAssistant([MaxGram()])
    out = target.generate(
        input_ids, attention_mask=mask, do_sample=False, max_new_tokens=32, eos_token_id=None, assistant_model=a
    )
    assert out.tolist() == plain.tolist()
    assert a.last_stats.compactions > 0


# -- (3) no state leak ----------------------------------------------------------------------------------------


def assert_no_state_leak(
    target, make_assistant, first, second, do_sample: bool, new: int = 10, stateful: bool = False
) -> None:
    """The contract's check (:func:`tests.test_contract.assert_no_state_leak`), batches as ``(ids, mask)``."""
    contract_no_state_leak(target, make_assistant, first, second, do_sample, new, stateful)


@pytest.mark.parametrize("name", list(REGISTRY))
def test_no_state_leak(name, monkeypatch, open_gate):
    """Batch then single prompt, single prompt then batch: greedy on Gemma3, sampled on the small target."""
    monkeypatch.setattr(time, "perf_counter", FakeClock())
    gemma = base_kit("gemma3").target
    kit = fresh_kit("gemma3", gemma)
    batch, single = left_pad(ROWS), (ASCENDING, None)
    assert_no_state_leak(
        gemma, lambda: registry_assistant(name, kit), batch, single, do_sample=False, stateful=name in STATEFUL
    )
    assert_no_state_leak(
        gemma, lambda: registry_assistant(name, kit), single, batch, do_sample=False, stateful=name in STATEFUL
    )
    small = base_kit("small").target
    kit = fresh_kit("small", small)
    batch, single = left_pad([[1, 5, 6, 5, 6, 5], [1, 9, 12], [7]]), (ids(1, 9, 12), None)
    assert_no_state_leak(
        small, lambda: registry_assistant(name, kit), single, batch, do_sample=True, stateful=name in STATEFUL
    )
    assert_no_state_leak(
        small, lambda: registry_assistant(name, kit), batch, single, do_sample=True, stateful=name in STATEFUL
    )


# -- (7) pipeline ----------------------------------------------------------------------------------------------

PIPE_TEXTS = [
    "w5 w6 w7 w5 w6 w7 w5",
    "w9",
    "w30 w31 w32 w33 w34 w35 w36 w30 w31 w32 w33 w34",
    "w12 w13",
    "w50 w51 w50 w51 w50",
    "w70 w71 w72",
]


def test_pipeline_batch_size_4(open_gate):
    """``pipeline("text-generation", ..., batch_size=4)`` on 6 prompts (a batch of 4, then of 2): the same texts
    with an assistant as without."""
    target = base_kit("llama").target
    tok = tm.word_tokenizer()
    tok.padding_side = "left"
    kw = {"max_new_tokens": 16, "do_sample": False}
    plain = pipeline("text-generation", model=target, tokenizer=tok, batch_size=4)(PIPE_TEXTS, **kw)
    a = CascadeAssistant([MaxGram()])
    pipe = pipeline("text-generation", model=target, tokenizer=tok, batch_size=4, assistant_model=a)
    out = pipe(PIPE_TEXTS, **kw)
    assert out == plain
    assert isinstance(a.last_stats, BatchStats) and len(a.last_stats.rows) == 2  # the last batch: 2 prompts
    assert any(t[0]["generated_text"] != p for t, p in zip(out, PIPE_TEXTS))


# -- (8) the real Gemma-3-270M -------------------------------------------------------------------------------------

SPEC_BENCH_LIKE = [
    "Write a haiku about autumn.",
    (
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
        "clips did Natalia sell altogether in April and May?"
    ),
    "Translate to German: The weather is nice today.",
    (
        "Summarize the following text: The Industrial Revolution began in Great Britain in the late 18th century and "
        "spread to other parts of the world. It marked a major turning point in history, as almost every aspect of "
        "daily life was influenced in some way. Average income and population began to exhibit unprecedented "
        "sustained growth."
    ),
]


@pytest.mark.real_model
def test_real_gemma_batch(gemma, open_gate):
    """Four Spec-Bench-like prompts of 13 to 69 tokens (the repository's prompt format, as the other real-model
    tests), ``B = 4``, 48 greedy tokens. The pipeline without an assistant (``batch_size=4``, token ids returned)
    is plain batched ``generate`` of the padded batch; with ``CascadeAssistant([MaxGram()])`` it returns the same
    ids (hence texts), and ``generate`` with the shipped vanilla drafter (a neural cascade) the same rows.
    ``cpu_kernels=False``: the CPU backend's one-time setup for a 262k vocabulary costs ~15 s on one thread (the
    batch with the kernels: the tiny-model tests above)."""
    from pathlib import Path

    from hf_cascade.data import format_prompt
    from hf_cascade.loading import load_head

    model, tok = gemma
    assert tok.padding_side == "left" and tok.pad_token_id is not None
    prompts = [format_prompt(q) for q in SPEC_BENCH_LIKE]
    enc = tok(prompts, return_tensors="pt", padding=True)
    P, lengths = enc.input_ids.shape[1], enc.attention_mask.sum(1).tolist()
    assert min(lengths) < 20 and max(lengths) > 60, lengths
    new = 48
    kw = {"max_new_tokens": new, "do_sample": False, "return_tensors": True}

    def ids_of(result):
        return [r[0]["generated_token_ids"] for r in result]

    plain = ids_of(pipeline("text-generation", model=model, tokenizer=tok, batch_size=4)(prompts, **kw))
    assert [row[:P] for row in plain] == enc.input_ids.tolist()  # the same padded batch
    a = CascadeAssistant([MaxGram()], cpu_kernels=False)
    out = pipeline("text-generation", model=model, tokenizer=tok, batch_size=4, assistant_model=a)(prompts, **kw)
    assert ids_of(out) == plain
    assert_batch_stats(a.last_stats, plain, P, stop_ids(model, {}))
    assert a.last_stats.target_calls < new
    drafter = load_head(Path(__file__).resolve().parent.parent / "model_cards" / "gemma-3-270m-drafter-xs").eval()
    a = CascadeAssistant([drafter, MaxGram()], cpu_kernels=False)
    out = model.generate(**enc, do_sample=False, max_new_tokens=new, assistant_model=a)
    for b in range(len(prompts)):
        assert out[b].tolist() == plain[b], b
    assert_batch_stats(a.last_stats, plain, P, stop_ids(model, {}))
    assert a.last_stats.target_calls < new
