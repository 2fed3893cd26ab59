"""``hf-cascade distill --dataset``: prompts from a ``datasets`` dataset (chat, instruction and text layouts,
local files, ``save_to_disk`` folders, splits), the chat template, and a clear error offline."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import tests.tiny_models as tm
from hf_cascade.training import DistillConfig, DistillStore, Prompt, distill
from hf_cascade.training.distill import prompt_ids
from hf_cascade.training.sources import CHAT, DEFAULT_DATASET, dataset_prompts, distill_prompts, prompt_messages
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

datasets = pytest.importorskip("datasets")

SHAREGPT = {
    "conversations": [
        {"from": "system", "value": "Be brief."},
        {"from": "human", "value": "w4 w5"},
        {"from": "gpt", "value": "w6"},
        {"from": "human", "value": "w7"},
    ]
}
OPENAI = {"messages": [{"role": "user", "content": "w8 w9"}, {"role": "assistant", "content": "w10"}]}


# -- one row -> the prompt's messages ------------------------------------------------------------
@pytest.mark.parametrize(
    "row, field, expected",
    [
        (SHAREGPT, None, ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "w4 w5"})),
        (OPENAI, None, ({"role": "user", "content": "w8 w9"},)),
        ({"instruction": "Sum.", "input": "1 2", "output": "3"}, None, ({"role": "user", "content": "Sum.\n\n1 2"},)),
        ({"instruction": "Sum.", "input": "", "output": "3"}, None, ({"role": "user", "content": "Sum."},)),
        ({"turns": ["first", "second"]}, None, ({"role": "user", "content": "first"},)),
        ({"question": "why?", "answer": "because"}, None, ({"role": "user", "content": "why?"},)),
        ({"body": "w4", "title": "t"}, "body", ({"role": "user", "content": "w4"},)),
        ({"chat": OPENAI["messages"]}, "chat", ({"role": "user", "content": "w8 w9"},)),
        ({"messages": [{"role": "assistant", "content": "hello"}]}, None, None),  # nothing asked
        ({"prompt": "   "}, None, None),  # an empty prompt
    ],
)
def test_prompt_messages_reads_every_layout(row, field, expected):
    assert prompt_messages(row, field) == expected


@pytest.mark.parametrize(
    "row, field, error, message",
    [
        ({"body": "x"}, None, ValueError, "no prompt field found in ['body']; name one with --field"),
        ({"body": "x"}, "text", KeyError, "no field 'text'; the rows have ['body']"),
        ({"messages": [{"role": "narrator", "content": "x"}]}, None, ValueError, "a chat turn needs role/from"),
        ({"messages": "w4"}, None, ValueError, "a chat must be a list of turns"),
    ],
)
def test_prompt_messages_rejects_unreadable_rows(row, field, error, message):
    with pytest.raises(error, match=message.replace("[", r"\[").replace("]", r"\]").replace("?", r"\?")):
        prompt_messages(row, field)


# -- a dataset -> prompts ------------------------------------------------------------------------
def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_dataset_prompts_from_a_data_file_dedups_drops_the_benchmark_and_limits(tmp_path):
    from hf_cascade.data import load_specbench

    bench = load_specbench(per_category=1)[0]["turns"][0]
    rows = [OPENAI, {"question": bench}, SHAREGPT, OPENAI, {"question": "w11"}, {"question": "w12"}]
    prompts = dataset_prompts(str(_jsonl(tmp_path / "chats.jsonl", rows)))
    assert [p.id for p in prompts] == ["chats:train:0", "chats:train:2", "chats:train:4", "chats:train:5"]
    assert prompts[1] == Prompt("chats:train:2", "chats", "w4 w5", prompt_messages(SHAREGPT))
    assert [p.id for p in dataset_prompts(str(tmp_path / "chats.jsonl"), limit=2)] == ["chats:train:0", "chats:train:2"]
    parquet = tmp_path / "q.parquet"
    datasets.Dataset.from_list([{"question": "w11"}, {"question": "w12"}]).to_parquet(str(parquet))
    assert [p.text for p in dataset_prompts(str(parquet))] == ["w11", "w12"]
    with pytest.raises(ValueError, match="one data file"):
        dataset_prompts(str(parquet), split="test")


def test_dataset_prompts_from_a_saved_dataset_dict_picks_the_split(tmp_path):
    saved = tmp_path / "saved"
    datasets.DatasetDict(
        {
            "train_sft": datasets.Dataset.from_list([{"question": "w4"}, {"question": "w5"}]),
            "test_sft": datasets.Dataset.from_list([{"question": "w6"}]),
        }
    ).save_to_disk(str(saved))
    assert [p.text for p in dataset_prompts(str(saved), split="test_sft")] == ["w6"]
    assert dataset_prompts(str(saved), split="train_sft")[1].id == "saved:train_sft:1"
    with pytest.raises(ValueError, match=r"has the splits \['train_sft', 'test_sft'\]; choose one with --split"):
        dataset_prompts(str(saved))
    with pytest.raises(ValueError, match="has no split 'validation'"):
        dataset_prompts(str(saved), split="validation")
    with pytest.raises(FileNotFoundError, match="no dataset at"):
        dataset_prompts(str(tmp_path / "missing" / "x"))


def test_a_hub_dataset_offline_fails_with_what_to_do_instead(tmp_path):
    """No network (HF_HUB_OFFLINE, as in CI): the default dataset id cannot be read; the error says how to
    pass a local copy. A fresh process, since ``datasets`` reads the switch at import."""
    code = (
        "from hf_cascade.training.sources import dataset_prompts, DEFAULT_DATASET\n"
        "try:\n    dataset_prompts(DEFAULT_DATASET, 'train_sft', limit=2)\n"
        "except ConnectionError as e:\n    print('ERROR', e)\n"
    )
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"could not load the dataset '{DEFAULT_DATASET}'" in out.stdout and "--dataset PATH" in out.stdout


def test_distill_prompts_sources(tmp_path, monkeypatch):
    import hf_cascade.training.sources as sources

    data = str(_jsonl(tmp_path / "d.jsonl", [OPENAI]))
    with pytest.raises(ValueError, match="give one"):
        distill_prompts([data], data)
    with pytest.raises(ValueError, match="--split and --field apply to --dataset"):
        distill_prompts(None, None, split="train")
    assert distill_prompts(None, data) == (dataset_prompts(data), True)
    # without the repository's prompt folder (and no $HF_CASCADE_TRAIN_PROMPTS), the public default
    monkeypatch.delenv("HF_CASCADE_TRAIN_PROMPTS", raising=False)
    monkeypatch.setattr(sources, "training_prompts", lambda files: (_ for _ in ()).throw(FileNotFoundError("x")))
    asked, logged = [], []
    monkeypatch.setattr(sources, "dataset_prompts", lambda *a: asked.append(a) or ["p"])
    assert distill_prompts(None, None, limit=7, log=logged.append) == (["p"], True)
    assert asked == [(DEFAULT_DATASET, "train_sft", None, 7)] and DEFAULT_DATASET in logged[0]
    with pytest.raises(FileNotFoundError):  # files named by the user are never replaced
        distill_prompts(["missing.jsonl"], None)
    monkeypatch.setenv("HF_CASCADE_TRAIN_PROMPTS", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError):  # nor a folder the user pointed to
        distill_prompts(None, None)


# -- the chat template ---------------------------------------------------------------------------
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _chat_tokenizer():
    tok = tm.word_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


def test_prompt_ids_applies_the_chat_template_once():
    tok = _chat_tokenizer()
    chat = Prompt("a:0", "a", "w8 w9", ({"role": "system", "content": "w4"}, {"role": "user", "content": "w8 w9"}))
    expected = tok("<s> <system> w4 <user> w8 w9 <assistant>", add_special_tokens=False).input_ids
    assert prompt_ids(chat, tok, CHAT) == expected and expected.count(tok.bos_token_id) == 1
    text_only = Prompt("b:0", "b", "w8 w9")  # a JSONL prompt: one user turn
    assert prompt_ids(text_only, tok, CHAT) == tok("<s> <user> w8 w9 <assistant>", add_special_tokens=False).input_ids
    assert prompt_ids(chat, tok, "{question}") == tok("w8 w9").input_ids
    with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
        prompt_ids(chat, tm.word_tokenizer(), CHAT)


def test_cli_distills_a_dataset_with_the_chat_template(tmp_path, monkeypatch):
    """``hf-cascade distill --dataset FILE`` end to end on the tiny target: chat-formatted prompts in the store."""
    import hf_cascade.bench.loading as loading
    from hf_cascade.cli import main

    target, tok = tm.llama_target(), _chat_tokenizer()
    monkeypatch.setattr(loading, "load_model", lambda spec: (target, tok))
    data = _jsonl(tmp_path / "chats.jsonl", [SHAREGPT, OPENAI, {"question": "w12 w13"}])
    out = tmp_path / "store"
    argv = [
        "distill",
        "--dataset",
        str(data),
        "--out",
        str(out),
        "--max-new-tokens",
        "4",
        "--batch-size",
        "2",
        "--no-progress",
    ]
    assert main(argv) == 0
    store = DistillStore.open(out)
    assert store.meta["prompt_format"] == CHAT and len(store) == 3
    first = next(r for r in store.records if r.id == "chats:train:0")
    prompt = store.sequence(store.records.index(first))[0][: first.prompt_len].tolist()
    assert prompt == tok("<s> <system> Be brief. <user> w4 w5 <assistant>", add_special_tokens=False).input_ids
    assert main(argv) == 0 and len(DistillStore.open(out)) == 3  # resumed: nothing new to do
    plain = tmp_path / "plain"
    assert main([*argv[:4], str(plain), *argv[5:], "--prompt-format", "plain"]) == 0
    assert DistillStore.open(plain).meta["prompt_format"] != CHAT


def test_distill_in_chat_format_matches_formatting_by_hand(tmp_path):
    target, tok = tm.llama_target(), _chat_tokenizer()
    prompts = [Prompt("a:0", "a", "w4 w5"), Prompt("a:1", "a", "w6", ({"role": "user", "content": "w6"},))]
    store = distill(
        target,
        tok,
        DistillConfig(tmp_path / "s", prompt_format=CHAT, max_new_tokens=3, batch_size=2),
        prompts,
        progress=False,
    )
    lens = {r.id: r.prompt_len for r in store.records}
    assert lens == {"a:0": len(prompt_ids(prompts[0], tok, CHAT)), "a:1": len(prompt_ids(prompts[1], tok, CHAT))}


def test_bench_prompts_through_the_chat_template():
    """``hf-cascade bench --prompt-format chat``: each Spec-Bench question's first turn, as one user turn through the
    target tokenizer's chat template, is what runs (``input_ids``) and what is recorded (``prompt``); the config
    keeps the format (left out when plain); a tokenizer without a template is refused with the fix."""
    from hf_cascade.bench.command import bench_config
    from hf_cascade.bench.config import BenchConfig
    from hf_cascade.bench.loading import load_prompts
    from hf_cascade.cli import build_parser

    tok = _chat_tokenizer()
    plain, chat = load_prompts(None, 1), load_prompts(None, 1, tok, "chat")
    assert len(chat) == len(plain) == 13 and all("input_ids" not in p for p in plain)
    for p, c in zip(plain, chat):
        question = c["turns"][0].strip()
        assert c["input_ids"] == tok(f"<s> <user> {question} <assistant>", add_special_tokens=False).input_ids
        assert c["prompt"] == tok.decode(c["input_ids"]) and p["prompt"] != c["prompt"]
    with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
        load_prompts(None, 1, tm.word_tokenizer(), "chat")
    config = bench_config(build_parser().parse_args(["bench", "--prompt-format", "chat"]))
    assert config.prompt_format == "chat" and config.to_dict()["prompt_format"] == "chat"
    assert "prompt_format" not in bench_config(build_parser().parse_args(["bench"])).to_dict()
    with pytest.raises(ValueError, match="prompt_format must be 'plain' or 'chat'"):
        BenchConfig(prompt_format="chatml")
