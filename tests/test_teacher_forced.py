"""Teacher-forced distillation (hf_cascade.training.teacher) and sharded stores on a tiny target: an interrupted
extraction, resumed, writes the uninterrupted run's shards byte for byte; the stored features are the target's own
forward over the text; no Spec-Bench text passes; chat records go through the chat template; training opens a
sharded store mixed with a greedy one and reads it from disk."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from hf_cascade.data import chat_prompt_ids
from hf_cascade.training.loop import TrainConfig
from hf_cascade.training.run_redrafter import ReDrafterSpec, train_redrafter
from hf_cascade.training.sources import CHAT, Text, training_texts
from hf_cascade.training.store import DistillStore, ShardedStore
from hf_cascade.training.teacher import TeacherConfig, teacher_forced, text_ids
from tests import tiny_models as tm
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(f"w{rng.randrange(4, tm.VOCAB)}" for _ in range(n))


def _texts(n: int = 13, seed: int = 3) -> list[Text]:
    rng = random.Random(seed)
    return [
        Text(
            f"text:t:{i}",
            "t",
            _words(rng, rng.randrange(2, 9)),
            None if i % 4 == 3 else _words(rng, rng.randrange(1, 14)),
        )
        for i in range(n)
    ]


TEXTS = _texts()


def _config(out, **kw) -> TeacherConfig:
    # small windows, batches and shards: several of each, texts cut at max_len
    return TeacherConfig(out, prompt_format="{question}", max_len=16, batch_tokens=40, window=5, shard_tokens=30, **kw)


def _shard_bytes(path) -> dict[str, bytes]:
    return {f"{d.name}/{f.name}": f.read_bytes() for d in sorted(path.iterdir()) for f in sorted(d.iterdir())}


@pytest.fixture(scope="module")
def target():
    return tm.llama_target()


@pytest.fixture(scope="module")
def extracted(target, tmp_path_factory):
    out = tmp_path_factory.mktemp("tf") / "full"
    store = teacher_forced(target, tm.word_tokenizer(), _config(out), TEXTS, target_name="tiny", progress=False)
    return out, store


def test_one_record_per_text_in_shards(extracted, target):
    out, store = extracted
    assert isinstance(store, ShardedStore) and len(store.shards) >= 3
    assert [s.num_tokens >= 30 for s in store.shards[:-1]] == [True] * (len(store.shards) - 1)
    assert sorted(r.id for r in store.records) == sorted(t.id for t in TEXTS)
    assert store.meta["teacher_forced"] is True and store.meta["max_new_tokens"] is None
    assert store.hidden_size == target.config.hidden_size


def test_resume_after_an_interruption_writes_the_same_store(extracted, target, tmp_path):
    out, _ = extracted
    tok = tm.word_tokenizer()
    part = tmp_path / "part"
    first = teacher_forced(target, tok, _config(part, limit=6), TEXTS, target_name="tiny", progress=False)
    assert len(first) == 6
    last = sorted(part.iterdir())[-1]  # interrupted again while writing the next record
    with open(last / "tokens.bin", "ab") as f:
        f.write(b"\x05\x00\x00\x00\x09")
    with open(last / "hidden.bin", "ab") as f:
        f.write(b"\x01\x02\x03")
    with open(last / "records.jsonl", "a") as f:
        f.write('{"id": "text:t:9", "sour')
    resumed = teacher_forced(target, tok, _config(part), TEXTS, target_name="tiny", progress=False)
    assert len(resumed) == len(TEXTS)
    assert _shard_bytes(part) == _shard_bytes(out)
    again = teacher_forced(target, tok, _config(part), TEXTS, target_name="tiny", progress=False)
    assert again.num_tokens == resumed.num_tokens and _shard_bytes(part) == _shard_bytes(out)
    with pytest.raises(ValueError, match="other settings"):
        teacher_forced(
            target,
            tok,
            TeacherConfig(part, prompt_format="{question}", max_len=8),
            TEXTS,
            target_name="tiny",
            progress=False,
        )


@torch.no_grad()
def test_features_are_the_targets_forward_on_the_text(extracted, target):
    _, store = extracted
    tok = tm.word_tokenizer()
    by_id = {t.id: t for t in TEXTS}
    hidden = store.hidden()
    cut = 0
    for i, r in enumerate(store.records):
        ids, plen = text_ids(by_id[r.id], tok, "{question}")
        seq, stored_plen = store.sequence(i)
        assert seq.tolist() == ids[:16] and stored_plen == min(plen, 16)
        cut += len(ids) > 16
        alone = target(input_ids=torch.tensor([seq.tolist()]), output_hidden_states=True).hidden_states[-1][0]
        got = torch.from_numpy(np.asarray(hidden[r.offset : r.offset + r.length], dtype=np.float32))
        torch.testing.assert_close(got, alone.to(torch.float16).float(), atol=2e-3, rtol=2e-3)
    assert cut > 0  # max_len cut some texts


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_no_specbench_text_passes(tmp_path, monkeypatch):
    turn = "Describe in detail how the old lighthouse keeper spent the long winter nights alone on the rocky island."
    bench = _write_jsonl(
        tmp_path / "question.jsonl", [{"question_id": 1, "category": "writing", "turns": ["Name a river.", turn]}]
    )
    monkeypatch.setenv("HF_CASCADE_SPECBENCH", str(bench))
    article = "Some news first. " + " ".join(turn.split()[2:15]) + " And more."  # a 13-word run of the turn
    f = _write_jsonl(
        tmp_path / "mine.jsonl",
        [
            {"question": "  name a RIVER. ", "answer": "The Nile."},  # a Spec-Bench question
            {"question": "What is 2 + 2?", "answer": "It is 4. " + turn.upper()},  # its turn in the answer
            {"prompt": article},  # inside a long context
            {"question": "Mary has <<3*2=6>>6 apples?", "answer": "She has 3*2 = <<3*2=6>>6 apples.\n#### 6"},
            {"prompt": " ".join(turn.split()[:11]) + " (eleven words)."},  # shorter runs pass
            {"instruction": "Sort these.", "instances": [{"input": "b a", "output": "a b"}]},
            {"turns": ["Tell a joke."]},
        ],
    )
    got = training_texts([f])
    assert [(t.id, t.answer) for t in got] == [
        ("text:mine:3", "She has 3*2 = 6 apples.\n#### 6"),
        ("text:mine:4", None),
        ("text:mine:5", "a b"),
        ("text:mine:6", None),
    ]
    assert got[2].prompt == "Sort these.\n\nb a"
    assert len(training_texts([f], exclude_benchmark=False)) == 7


TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} </turn> {% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_chat_records_use_the_chat_template(target, tmp_path):
    tok = tm.word_tokenizer()
    tok.chat_template = TEMPLATE
    text = Text("text:c:0", "c", "w8 w9", "w10 w11 w12")
    ids, plen = text_ids(text, tok, CHAT)
    whole = tok("<s> <user> w8 w9 </turn> <assistant> w10 w11 w12 </turn>", add_special_tokens=False).input_ids
    assert ids == whole and ids.count(tok.bos_token_id) == 1
    assert ids[:plen] == chat_prompt_ids(tok, [{"role": "user", "content": "w8 w9"}])
    assert text_ids(Text("text:c:1", "c", "w8 w9", None), tok, CHAT) == (ids[:plen], plen)
    store = teacher_forced(target, tok, TeacherConfig(tmp_path / "chat", prompt_format=CHAT), [text], progress=False)
    assert store.sequence(0)[0].tolist() == ids and store.meta["prompt_format"] == CHAT
    with pytest.raises(ValueError, match="chat template"):
        text_ids(text, tm.word_tokenizer(), CHAT)


def test_training_streams_from_a_sharded_store(extracted, target, tmp_path):
    out, _ = extracted
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for shard in sorted(out.iterdir()):
        (mixed / shard.name).symlink_to(shard)
    greedy = DistillStore.create_or_resume(
        tmp_path / "greedy",
        {
            "target": "tiny",
            "prompt_format": "{question}",
            "max_new_tokens": 8,
            "hidden_size": 0,
            "vocab_size": tm.VOCAB,
        },
    )
    greedy.append("g:0", "g", [5, 6], [7, 8, 2], True)
    (mixed / "zz-greedy").symlink_to(tmp_path / "greedy")

    store = DistillStore.open(mixed)
    shards = [DistillStore.open(d) for d in sorted(out.iterdir())] + [greedy]
    assert isinstance(store, ShardedStore) and len(store) == sum(len(s) for s in shards)
    assert store.hidden_size == 0 and store.meta["max_new_tokens"] == [None, 8]  # one shard has none
    flat = [(s, i) for s in shards for i in range(len(s))]
    for k, (s, i) in enumerate(flat):
        r = store.records[k]
        seq = store.sequence(k)[0]
        assert np.array_equal(seq, s.sequence(i)[0])
        assert np.array_equal(store.tokens()[r.offset : r.offset + r.length], seq)

    tf = DistillStore.open(out)  # every shard with hidden states
    rows = tf.hidden()
    assert not isinstance(rows, np.ndarray)  # read by slice from each shard's memory map
    base = 0
    for s in tf.shards:
        assert isinstance(s.hidden(), np.memmap)
        assert np.array_equal(rows[base : base + s.num_tokens], s.hidden())
        base += s.num_tokens
    assert np.array_equal(rows[25:70], np.concatenate([s.hidden() for s in tf.shards])[25:70])  # across shards

    cfg = TrainConfig(
        tmp_path / "head", steps=2, batch_size=4, eval_every=2, eval_records=2, max_len=16, lr=1e-2, warmup=1
    )
    spec = ReDrafterSpec(exit_dim=24, num_draft_layers=1, draft_vocab_size=64, beam_length=3)
    _, state = train_redrafter(target, out, cfg, spec, target_name="tiny", command="test", progress=False)
    ts = json.loads((tmp_path / "head" / "trainer_state.json").read_text())
    assert ts["hidden_states"] == "store" and ts["data"]["sequences"] == len(TEXTS) and state.step == 2
