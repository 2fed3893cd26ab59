"""``hf-cascade train vanilla|glide|redrafter`` from the command line: bad arguments fail before the
(slow) target load, and every head trains end to end on the tiny target and store of test_training.py."""

from __future__ import annotations

import json

import pytest

from hf_cascade.cli import main
from tests.test_training import distilled, target  # noqa: F401  (fixtures: tiny Llama target + its store)
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)


# -- the command line ----------------------------------------------------------------------------
@pytest.fixture
def no_target_load(monkeypatch):
    """Fail the test if the CLI tries to load a target (it must reject bad arguments first)."""
    import hf_cascade.bench.loading as loading

    def load_model(spec):
        pytest.fail(f"the target ({spec}) was loaded before the arguments were validated")

    monkeypatch.setattr(loading, "load_model", load_model)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "glide", "--preset", "huge"], "unknown glide preset 'huge'"),
        (["train", "redrafter", "--preset", "m"], "unknown redrafter preset 'm'"),
        (["train", "redrafter", "--no-cross-attention"], "--no-cross-attention applies to `train glide` only"),
        (["train", "vanilla", "--target-layers", "1"], "--target-layers applies to `train glide` only"),
        (
            ["train", "glide", "--target-layers", "0", "1"],
            "--target-layers needs one target layer per draft layer (1), got 2",
        ),
        (
            ["train", "vanilla", "--unroll", "3"],
            "--unroll and --feature-weight apply to `train glide` and `train redrafter`",
        ),
        (["train", "glide", "--unroll", "0"], "--unroll must be >= 1 and --feature-weight >= 0, got 0, 0.0"),
    ],
)
def test_cli_train_rejects_bad_arguments_before_loading_the_target(argv, message, tmp_path, capsys, no_target_load):
    assert main([*argv, "--data", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "hf-cascade train: error:" in err and message in err


@pytest.mark.parametrize(
    "head, flags, expected",
    [
        ("vanilla", ["--preset", "xs"], {"model_type": "hf_cascade_drafter"}),
        ("glide", [], {"model_type": "hf_cascade_glide", "cross_attention": True}),
        ("glide", ["--no-cross-attention"], {"model_type": "hf_cascade_glide", "cross_attention": False}),
        ("glide", ["--target-layers", "0"], {"model_type": "hf_cascade_glide", "target_layer_ids": [0]}),
        ("redrafter", ["--preset", "xs"], {"model_type": "hf_cascade_redrafter"}),
    ],
)
def test_cli_trains_every_head(head, flags, expected, distilled, target, tmp_path, monkeypatch):
    """``hf-cascade train vanilla|glide|redrafter`` end to end on the tiny target (loaded through the patched
    loader)."""
    import hf_cascade.bench.loading as loading

    monkeypatch.setattr(loading, "load_model", lambda spec: (target, None))
    out = tmp_path / head
    argv = [
        "train",
        head,
        *flags,
        "--data",
        str(distilled[2].out),
        "--out",
        str(out),
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--max-len",
        "48",
        "--eval-every",
        "2",
        "--eval-records",
        "2",
        "--draft-vocab",
        "64",
        "--no-progress",
    ]
    assert main(argv) == 0
    config = json.loads((out / "config.json").read_text())
    assert {k: config.get(k) for k in expected} == expected and config["auto_map"]
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["step"] == 2 and state["config"]["steps"] == 2 and state["best"] is not None
    # then greedy generate with the saved head, loaded from its folder, on the held-out prompts: lossless, measured
    generation = state["generation"]
    assert generation["prompts"] == 2 and generation["identical"] == 1.0 and generation["tokens_per_call"] >= 1.0
    card = (out / "README.md").read_text()
    assert card.count("## Measured in generate (held-out prompts)") == 1 and "| 100% |" in card


def test_cli_train_vanilla_missing_data_fails_before_loading_the_target(tmp_path, capsys, no_target_load):
    missing = tmp_path / "nope"
    assert main(["train", "vanilla", "--data", str(missing), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "hf-cascade train: error:" in err and str(missing) in err and "no meta.json" in err
    assert not (tmp_path / "o").exists()


def test_questions_sampled_from_the_target(target, tmp_path, monkeypatch):
    """``sample_questions`` on the tiny target (word tokenizer): new, distinct, not seeds, at least
    ``min_words`` words, reproducible from its seed; the CLI appends them for ``distill --prompts``."""
    from hf_cascade.training.questions import QuestionConfig, read_questions, sample_questions, seed_prompt
    from tests import tiny_models as tm

    tok = tm.word_tokenizer()
    general = ["w5 w6 w7 w8", "w9 w10 w11", "w12 w13 w14 w15 w16"]
    cfg = QuestionConfig(n=6, batch_size=4, max_new_tokens=6, seed=3)
    qs = sample_questions(target, tok, general, ["w20 w21"], cfg, progress=False)
    assert len(qs) == len(set(q.lower() for q in qs)) == 6
    assert all(len(q.split()) >= cfg.min_words and q not in general for q in qs)
    assert sample_questions(target, tok, general, ["w20 w21"], cfg, progress=False) == qs
    long_seed = " ".join(f"w{i % 40}" for i in range(300))  # > max_seed_chars: never a seed
    assert sample_questions(target, tok, general + [long_seed], ["w20 w21", long_seed], cfg, progress=False) == qs
    assert tok.padding_side == "right"  # restored
    assert seed_prompt("a?", "b?") == "Question: a?\n\nQuestion: b?\n\nQuestion:"
    again = sample_questions(
        target,
        tok,
        general,
        [],
        QuestionConfig(n=3, batch_size=4, max_new_tokens=6, seed=3),
        exclude=qs,
        progress=False,
    )
    assert not set(again) & set(qs)

    import hf_cascade.bench.loading as loading
    import hf_cascade.data as data

    monkeypatch.setattr(loading, "load_model", lambda spec: (target, tok))
    monkeypatch.setattr(
        data, "load_train_prompts", lambda files=None, **kw: general if "gsm8k_train.jsonl" not in files else []
    )
    out = tmp_path / "q.jsonl"
    for total in (4, 8):
        assert main(["questions", "--out", str(out), "--n", "4", "--batch-size", "4", "--no-progress"]) == 0
        assert len(read_questions(out)) == len(set(read_questions(out))) == total
