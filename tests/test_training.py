"""Drafter training (hf_cascade.training): the distillation store, vocabulary subsets, batches and
splits on hand-made data, then the whole path as CI runs it -- distill a small slice (interrupted and
resumed), train a few steps, save, reload as remote code in a fresh process, generate with it -- and
the ``hf-cascade train`` command line errors."""

from __future__ import annotations

import json
import os
import zlib

import numpy as np
import pytest
import torch

from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.data import find_shared_data
from hf_cascade.loading import load_head
from hf_cascade.training import DistillConfig, DistillStore, Prompt, Record, distill, training_prompts
from hf_cascade.training.loop import TrainConfig, iterate_batches, make_batch, split_records
from hf_cascade.training.run import train_vanilla
from hf_cascade.training.soft_labels import load_soft_labels
from hf_cascade.training.vanilla import VanillaSpec, _run_lengths, build_vanilla, vanilla_loss
from hf_cascade.training.vocab import coverage, frequent_subset, token_counts
from tests import tiny_models as tm
from tests.fresh_process import run_offline
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

META = {"target": "tiny", "prompt_format": "{question}", "max_new_tokens": 8, "hidden_size": 0, "vocab_size": 16}


def hand_store(path, seqs, meta=META) -> DistillStore:
    """A store of ``seqs`` = [(prompt ids, response ids, eos), ...], ids ``r0, r1, ...``."""
    store = DistillStore.create_or_resume(path, meta)
    for i, (p, r, eos) in enumerate(seqs):
        store.append(f"r{i}", "hand", p, r, eos)
    return store


# -- the store -----------------------------------------------------------------------------------
def test_store_append_and_read_round_trip(tmp_path):
    meta = {**META, "hidden_size": 3}
    store = DistillStore.create_or_resume(tmp_path / "d", meta)
    h0 = np.arange(15, dtype=np.float32).reshape(5, 3) / 4
    h1 = -np.arange(6, dtype=np.float32).reshape(2, 3)
    r0 = store.append("a:0", "a", [1, 4, 5], [6, 2], True, h0)
    r1 = store.append("b:0", "b", [1], np.array([7]), False, h1)
    assert r0 == Record("a:0", "a", 0, 3, 5, True) and r1 == Record("b:0", "b", 5, 1, 2, False)
    with pytest.raises(ValueError, match="hidden states"):
        store.append("c:0", "c", [1, 4], [5], False, np.zeros((2, 3)))  # 3 rows expected
    assert len(store) == 2 and store.num_tokens == 7  # the failed append wrote nothing

    again = DistillStore.open(tmp_path / "d")
    assert again.meta == {"format_version": 1, **meta}
    assert again.records == [r0, r1] and again.done_ids() == {"a:0", "b:0"}
    assert again.tokens().tolist() == [1, 4, 5, 6, 2, 1, 7] and again.tokens().dtype == np.int32
    seq, plen = again.sequence(1)
    assert seq.tolist() == [1, 7] and plen == 1
    assert np.array_equal(again.hidden(), np.concatenate([h0, h1]).astype(np.float16))
    assert os.path.getsize(tmp_path / "d" / "tokens.bin") == 7 * 4
    assert os.path.getsize(tmp_path / "d" / "hidden.bin") == 7 * 3 * 2

    empty = DistillStore.create_or_resume(tmp_path / "e", META)
    assert len(empty) == 0 and empty.tokens().shape == (0,)
    with pytest.raises(ValueError, match="no hidden states"):
        empty.hidden()
    with pytest.raises(FileNotFoundError, match="hf-cascade distill"):
        DistillStore.open(tmp_path / "missing")


def test_store_resume_after_torn_write(tmp_path):
    path = tmp_path / "d"
    meta = {**META, "hidden_size": 2}
    store = DistillStore.create_or_resume(path, meta)
    store.append("a:0", "a", [1, 4], [5, 2], True, np.ones((4, 2)))
    store.append("a:1", "a", [1, 6, 7], [8], False, np.full((4, 2), 2.0))
    # An interrupt in the middle of the third append: tokens half written, record line cut.
    with open(path / "tokens.bin", "ab") as f:
        f.write(b"\x09\x00\x00\x00\x0a\x00")
    with open(path / "hidden.bin", "ab") as f:
        f.write(b"\x00\x3c" * 5)
    with open(path / "records.jsonl", "a") as f:
        f.write('{"id": "a:2", "source": "a", "offs')

    resumed = DistillStore.create_or_resume(path, meta)
    assert resumed.done_ids() == {"a:0", "a:1"} and resumed.num_tokens == 8
    assert os.path.getsize(path / "tokens.bin") == 8 * 4
    assert os.path.getsize(path / "hidden.bin") == 8 * 2 * 2
    assert len((path / "records.jsonl").read_text().splitlines()) == 2
    resumed.append("a:2", "a", [1, 9], [10, 2], True, np.zeros((4, 2)))

    final = DistillStore.open(path)
    assert [r.id for r in final.records] == ["a:0", "a:1", "a:2"]
    assert final.tokens().tolist() == [1, 4, 5, 2, 1, 6, 7, 8, 1, 9, 10, 2]
    assert final.hidden()[:, 0].tolist() == [1] * 4 + [2] * 4 + [0] * 4


def test_store_resume_with_other_settings_raises(tmp_path):
    hand_store(tmp_path / "d", [([1, 4], [5], False)])
    for key, value in (("max_new_tokens", 99), ("prompt_format", "Q: {question}"), ("target", "other")):
        with pytest.raises(ValueError, match="other settings"):
            DistillStore.create_or_resume(tmp_path / "d", {**META, key: value})
    assert len(DistillStore.create_or_resume(tmp_path / "d", META)) == 1
    meta = json.loads((tmp_path / "d" / "meta.json").read_text())
    (tmp_path / "d" / "meta.json").write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(ValueError, match="unsupported distillation format"):
        DistillStore.open(tmp_path / "d")


# -- vocabulary subsets --------------------------------------------------------------------------
def test_frequent_subset_golden():
    counts = np.array([0, 5, 3, 5, 0, 1, 3, 0])
    assert frequent_subset(counts, 4).tolist() == [1, 2, 3, 6]  # ties by id: 1 < 3, 2 < 6
    assert frequent_subset(counts, 3).tolist() == [1, 2, 3]
    assert frequent_subset(counts, 6).tolist() == [0, 1, 2, 3, 5, 6]  # unseen slot: lowest id 0
    assert frequent_subset(counts, 8).tolist() == list(range(8))
    assert frequent_subset(counts, 4, always=[7, 0]).tolist() == [0, 1, 3, 7]  # specials first, then 1, 3
    assert frequent_subset(counts, 3, always=[7, 7, 99, -1]).tolist() == [1, 3, 7]  # dupes / out of range dropped
    for n in (0, 9, -1):
        with pytest.raises(ValueError, match="draft vocabulary size"):
            frequent_subset(counts, n)


def test_coverage_golden():
    counts = np.array([0, 5, 3, 5, 0, 1, 3, 0])
    assert coverage(counts, torch.tensor([1, 3])) == pytest.approx(10 / 17)
    assert coverage(counts, torch.arange(8)) == 1.0
    assert coverage(np.zeros(4, dtype=np.int64), torch.tensor([0])) == 0.0


def test_token_counts_weights_responses(tmp_path):
    store = hand_store(tmp_path / "d", [([1, 4, 4], [5, 2], True), ([4], [5, 5], False)])
    plain = token_counts(store, 8, response_weight=1)
    assert plain.tolist() == [0, 1, 1, 0, 3, 3, 0, 0] and plain.dtype == np.int64
    weighted = token_counts(store, 8, response_weight=4)
    assert weighted.tolist() == [0, 1, 4, 0, 3, 12, 0, 0]  # 2 and 5 are response tokens


# -- batches, splits, acceptance -----------------------------------------------------------------
def test_run_lengths_golden():
    hit = np.array([1, 1, 0, 1, 1, 1, 0, 0, 1], dtype=bool)
    assert _run_lengths(hit, 8).tolist() == [2, 1, 0, 3, 2, 1, 0, 0, 1]
    assert _run_lengths(hit, 2).tolist() == [2, 1, 0, 2, 2, 1, 0, 0, 1]
    assert _run_lengths(np.zeros(0, dtype=bool), 4).tolist() == []


def test_make_batch_weights(tmp_path):
    store = hand_store(tmp_path / "d", [([1, 4, 5], [6, 2], True), ([1, 7], [8], False), ([9], [10, 11], False)])
    b = make_batch(store, [0, 1], max_len=64, prompt_weight=0.1, pad_id=0)
    assert b.input_ids.tolist() == [[1, 4, 5, 6, 2], [1, 7, 8, 0, 0]] and b.index == [0, 1]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    torch.testing.assert_close(b.weights, torch.tensor([[0, 0.1, 0.1, 1, 1], [0, 0.1, 1, 0, 0]]))

    cut = make_batch(store, [1, 0, 2], max_len=4, prompt_weight=0.5, pad_id=3)  # cut at 4 tokens, pad 3
    assert cut.input_ids.tolist() == [[1, 7, 8, 3], [1, 4, 5, 6], [9, 10, 11, 3]]
    torch.testing.assert_close(cut.weights, torch.tensor([[0, 0.5, 1, 0], [0, 0.5, 0.5, 1], [0, 1, 1, 0]]))


def test_split_records_deterministic_and_disjoint(tmp_path):
    seqs = [([1, 4 + i], [5], False) for i in range(10)]
    store = hand_store(tmp_path / "d", seqs)
    train, held = split_records(store, 3)
    assert len(held) == 3 and sorted(train + held) == list(range(10)) and not set(train) & set(held)
    assert split_records(DistillStore.open(tmp_path / "d"), 3) == (train, held)
    by_hash = sorted(range(10), key=lambda i: zlib.crc32(f"r{i}".encode()))
    assert held == sorted(by_hash[:3])
    # Same ids in another order: the same records are held out.
    rev = DistillStore.create_or_resume(tmp_path / "rev", META)
    for i in reversed(range(10)):
        rev.append(f"r{i}", "hand", *seqs[i])
    assert sorted(rev.records[j].id for j in split_records(rev, 3)[1]) == sorted(f"r{i}" for i in held)
    assert len(split_records(store, 50)[1]) == 9  # at least one record trains
    assert split_records(store, 0) == (list(range(10)), [])


# -- training prompts ----------------------------------------------------------------------------
def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_training_prompts_interleave_dedupe_and_exclude_specbench(tmp_path, monkeypatch):
    bench = _write_jsonl(
        tmp_path / "question.jsonl",
        [{"question_id": 1, "category": "writing", "turns": ["Write a  poem about Rust.", "Again."]}],
    )
    monkeypatch.setenv("HF_CASCADE_SPECBENCH", str(bench))
    a = _write_jsonl(
        tmp_path / "a.jsonl",
        [{"question": "A zero"}, {"question": "A one"}, {"question": "A two"}, {"question": "A three"}],
    )
    b = _write_jsonl(
        tmp_path / "b.jsonl",
        [{"instruction": "B zero"}, {"instruction": "  a ONE "}, {"turns": ["write a poem\nabout rust."]}],
    )
    got = training_prompts([a, b])
    assert [(p.id, p.source, p.text) for p in got] == [
        ("a:0", "a", "A zero"),
        ("b:0", "b", "B zero"),
        ("a:1", "a", "A one"),
        ("a:2", "a", "A two"),
        ("a:3", "a", "A three"),
    ]
    kept = training_prompts([a, b], exclude_benchmark=False)
    assert [p.id for p in kept] == ["a:0", "b:0", "a:1", "a:2", "b:2", "a:3"]
    assert training_prompts([b, a])[0].id == "b:0"
    assert training_prompts([]) == []


def test_training_prompts_exclude_the_real_specbench(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_CASCADE_SPECBENCH", raising=False)
    try:
        path = find_shared_data("shared/data/specbench/question.jsonl")
    except FileNotFoundError:
        pytest.skip("shared/data/specbench is not next to this checkout")
    question = json.loads(path.read_text().splitlines()[0])["turns"][0]
    f = _write_jsonl(
        tmp_path / "mine.jsonl",
        [{"prompt": "Tell me a joke."}, {"prompt": question.upper()}, {"prompt": "Name three rivers."}],
    )
    assert [p.id for p in training_prompts([f])] == ["mine:0", "mine:2"]


# -- the whole path: distill, train, save, reload, generate --------------------------------------
PROMPTS = [
    Prompt(f"t:{i}", "t", text)
    for i, text in enumerate(
        ["w5 w9", "w7 w11 w13", "w20 w21", "w30 w31 w32 w33", "w40 w41 w42", "w50 w51 w52 w53 w54", "w60 w61 w62"]
    )
]
# Sorted by length (as distill batches them) the first three prompts are the shortest, so a run stopped
# after 3 (limit=3) and resumed computes exactly the uninterrupted run's batches, [t0 t2 t1] [t4 t6 t3]
# [t5]: its store must be byte-identical (batch composition changes padding, hence float sums).


def _store_bytes(path) -> tuple[bytes, bytes, bytes]:
    return tuple((path / name).read_bytes() for name in ("meta.json", "tokens.bin", "records.jsonl"))


@pytest.fixture(scope="module")
def target():
    return tm.llama_target()


@pytest.fixture(scope="module")
def distilled(target, tmp_path_factory):
    tok = tm.word_tokenizer()
    base = tmp_path_factory.mktemp("distill")
    cfg = DistillConfig(base / "full", prompt_format="{question}", max_new_tokens=12, batch_size=3)
    store = distill(target, tok, cfg, PROMPTS, target_name="tiny", progress=False)
    return base, tok, cfg, store


def test_distill_stores_greedy_responses(distilled, target):
    _, tok, cfg, store = distilled
    assert len(store) == len(PROMPTS) and store.done_ids() == {p.id for p in PROMPTS}
    assert store.meta["prompt_format"] == "{question}" and store.meta["vocab_size"] == tm.VOCAB
    by_id = {r.id: i for i, r in enumerate(store.records)}
    for p in PROMPTS:
        seq, plen = store.sequence(by_id[p.id])
        rec = store.records[by_id[p.id]]
        assert seq[:plen].tolist() == tok(p.text).input_ids == [int(w[1:]) for w in p.text.split()]
        response = seq[plen:].tolist()
        assert 1 <= len(response) <= 12 and rec.eos == (response[-1] == tm.EOS)
        assert tm.EOS not in response[:-1] and (rec.eos or len(response) == 12)
    # The longest prompt of a batch has no padding: its response is plain greedy generate's.
    seq, plen = store.sequence(by_id["t:5"])
    plain = target.generate(ids(*seq[:plen].tolist()), do_sample=False, max_new_tokens=12)[0, plen:].tolist()
    assert seq[plen:].tolist() == plain[: len(seq) - plen]


def test_distill_drafts_and_stores_what_plain_batches_store(distilled, target):
    """Distillation with the CLI's assistant (``hf-cascade distill`` without ``--no-speculative``) runs its batches
    through the package's batched speculative decoding: it drafts, and its store is byte for byte the store of
    plain batched ``generate``."""
    from hf_cascade.cli import _maxgram_assistant

    base, tok, cfg, store = distilled
    made = []

    def assistant():
        made.append(_maxgram_assistant())
        return made[-1]

    spec = distill(
        target,
        tok,
        DistillConfig(base / "spec", prompt_format="{question}", max_new_tokens=12, batch_size=3, assistant=assistant),
        PROMPTS,
        target_name="tiny",
        progress=False,
    )
    assert len(made) == 3  # one assistant per batch
    stats = [a.last_stats for a in made]
    assert sum(s.new_tokens for s in stats) > sum(s.target_calls for s in stats)  # drafts were accepted
    assert _store_bytes(base / "spec") == _store_bytes(cfg.out)  # the fixture's: plain batches
    assert len(spec) == len(store)


def test_distill_interrupt_and_resume_equals_one_run(distilled, target):
    base, tok, cfg, _ = distilled
    part = DistillConfig(base / "part", prompt_format="{question}", max_new_tokens=12, batch_size=3, limit=3)
    first = distill(target, tok, part, PROMPTS, target_name="tiny", progress=False)
    assert len(first) == 3
    # Interrupted again in the middle of writing the next record.
    with open(part.out / "tokens.bin", "ab") as f:
        f.write(b"\x05\x00\x00\x00\x09")
    with open(part.out / "records.jsonl", "a") as f:
        f.write('{"id": "t:4", "sour')
    part.limit = None
    resumed = distill(target, tok, part, PROMPTS, target_name="tiny", progress=False)
    assert len(resumed) == len(PROMPTS)
    assert _store_bytes(part.out) == _store_bytes(cfg.out)
    assert distill(target, tok, part, PROMPTS, target_name="tiny", progress=False).num_tokens == resumed.num_tokens
    with pytest.raises(ValueError, match="other settings"):
        distill(
            target,
            tok,
            DistillConfig(part.out, prompt_format="{question}", max_new_tokens=5),
            PROMPTS,
            target_name="tiny",
            progress=False,
        )


SPEC = VanillaSpec(
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    intermediate_size=32,
    draft_vocab_size=64,
)
COMMAND = "hf-cascade train vanilla --data tiny-distill --steps 6"


@pytest.fixture(scope="module")
def trained(distilled, target, tmp_path_factory):
    _, _, cfg, _ = distilled
    out = tmp_path_factory.mktemp("train") / "drafter"
    train_cfg = TrainConfig(out, steps=6, batch_size=2, eval_every=3, eval_records=2, max_len=64, lr=5e-2, warmup=1)
    torch.manual_seed(0)
    initial, _ = build_vanilla(target, DistillStore.open(cfg.out), SPEC, "tiny")  # what train_vanilla starts from
    torch.manual_seed(0)
    model, state = train_vanilla(target, cfg.out, train_cfg, SPEC, target_name="tiny", command=COMMAND, progress=False)
    return out, model, state, initial, train_cfg


def test_train_vanilla_learns_and_saves_hub_layout(trained, distilled):
    out, model, state, initial, train_cfg = trained
    store = distilled[3]
    losses = [h["loss"] for h in state.history if "loss" in h]
    evals = [h for h in state.history if "eval" in h]
    assert len(losses) == 6 and [h["step"] for h in evals] == [3, 6] and state.step == 6
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    # The loss on all training sequences falls well below the start's (~ln 64: a near-uniform drafter).
    train_idx, _ = split_records(store, 2)
    first = next(iterate_batches(store, train_idx, train_cfg))
    assert vanilla_loss(initial.train(), first)[0].item() == pytest.approx(losses[0], rel=1e-5)  # same start
    everything = make_batch(store, train_idx, 64, train_cfg.prompt_weight)
    with torch.no_grad():
        before, after = (vanilla_loss(m.eval(), everything)[0].item() for m in (initial, model))
    assert after < 0.85 * before, (before, after)
    assert {"alpha", "tau@4", "tau@8", "eval_tokens"} <= set(evals[-1]["eval"])
    assert evals[-1]["eval"]["eval_tokens"] > 0

    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_cascade_drafter.CascadeDrafterForCausalLM"
    assert config["draft_vocab_size"] == 64 and config["vocab_size"] == tm.VOCAB and config["hidden_size"] == 16
    assert {"model.safetensors", "modeling_cascade_drafter.py", "configuration_cascade_drafter.py"} <= set(
        os.listdir(out)
    )
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\n") and "pipeline_tag: text-generation" in card
    assert COMMAND in card and "## Measured acceptance" in card
    assert "| before training |" in card and "| this checkpoint (step 6) |" in card
    ts = json.loads((out / "trainer_state.json").read_text())
    assert ts["step"] == 6 and ts["config"]["out"] == str(out) and ts["spec"]["draft_vocab_size"] == 64
    assert ts["data"]["sequences"] == len(PROMPTS) and ts["data"]["heldout_sequences"] == 2
    # The subset covers every token of the data (64 slots, fewer distinct tokens) plus the specials.
    assert ts["vocab"]["coverage_all"] == 1.0
    assert {tm.PAD, tm.BOS, tm.EOS} <= set(model.vocab_subset.tolist())


def test_trained_drafter_reloads_as_remote_code_and_generates_exactly(trained, target, tmp_path):
    out, model = trained[:2]
    x = ids(1, 5, 9, 13, 40, 41, 2, 95)
    with torch.no_grad():
        torch.save({"x": x, "logits": model(x).logits}, tmp_path / "expected.pt")
    script = f"""
import sys, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True).eval()
assert not any(k.startswith("hf_cascade") for k in sys.modules), "hf_cascade was imported"
e = torch.load({str(tmp_path / "expected.pt")!r})
with torch.no_grad():
    assert torch.equal(m(e["x"]).logits, e["logits"]), (m(e["x"]).logits - e["logits"]).abs().max()
print("OK")
"""
    assert run_offline(script, tmp_path).split() == ["OK"]

    reloaded = load_head(out).eval()
    for prompt in (ids(1, 5, 9), ids(1, 50, 51, 52, 53, 54)):
        expected = target.generate(prompt, do_sample=False, max_new_tokens=16)
        assistant = CascadeAssistant([reloaded, MaxGram()])
        got = target.generate(prompt, do_sample=False, max_new_tokens=16, assistant_model=assistant)
        assert got.tolist() == expected.tolist()
        assert assistant.last_stats.levels[0].forward_calls >= 1
        got_hf = target.generate(prompt, do_sample=False, max_new_tokens=16, assistant_model=reloaded)
        assert got_hf.tolist() == expected.tolist()


def test_train_vanilla_with_soft_labels(distilled, target, tmp_path):
    """``soft_labels=K``: the table is computed once into the store and reused; the loss reports both
    terms and falls; the card says what it was trained on."""
    _, _, cfg, store = distilled
    train_cfg = TrainConfig(
        tmp_path / "soft", steps=6, batch_size=2, eval_every=3, eval_records=2, max_len=64, lr=5e-2, warmup=1
    )
    torch.manual_seed(0)
    model, state = train_vanilla(
        target, cfg.out, train_cfg, SPEC, target_name="tiny", command=COMMAND, progress=False, soft_labels=4
    )
    losses = [h for h in state.history if "loss" in h]
    assert all({"hard", "soft"} <= set(h) for h in losses) and losses[-1]["soft"] < losses[0]["soft"]
    assert load_soft_labels(store, model.vocab_subset, 4) is not None
    card = (tmp_path / "soft" / "README.md").read_text()
    assert "top-4 distribution" in card
    assert json.loads((tmp_path / "soft" / "trainer_state.json").read_text())["vocab"]["soft_labels"] == 4
