"""Batched sweep of ``hf-cascade bench --batch-size`` (:mod:`hf_cascade.bench.batched`) on the tiny Llama of
``tests/test_bench.py``: prompts cut into left-padded batches, tokens counted through EOS, every row compared
with plain's, baselines that cannot batch skipped and noted, the JSON / report / PNG. No assertion on speed."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from hf_cascade.bench import BenchConfig, BenchResult, loading, markdown_report, run_benchmark, write_results  # noqa: E402
from hf_cascade.bench.batched import (
    UNBATCHED,
    make_batches,
    pad_token_id,
    run_batched,
    skipped,  # noqa: E402
    stopped_rows,
    versus,
)
from hf_cascade.bench.config import BASELINES, STRATEGIES, parse_batch_sizes  # noqa: E402
from hf_cascade.bench.methods import Method  # noqa: E402
from hf_cascade.bench.report import markdown_batched  # noqa: E402
from hf_cascade.cli import bench_config, build_parser, main  # noqa: E402
from tests.test_bench import PROMPTS, _llama, _tokenizer
from tests.test_glide_decode import echo_glide
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

#: three prompts of different lengths (32, 19 and 7 tokens): batches of 2 are one padded pair and one single
BATCH_PROMPTS = [*PROMPTS, {"category": "qa", "prompt": "the dog sat on the mat ."}]
NEW = 12


# -- batching, padding, counting -------------------------------------------------------------------


def test_batches_are_left_padded_like_the_tokenizer():
    tok = _tokenizer()
    batches = make_batches(tok, BATCH_PROMPTS, 2)
    assert [b.prompt_indices for b in batches] == [[0, 1], [2]] and [b.index for b in batches] == [0, 1]
    tok.padding_side = "left"
    for batch in batches:
        texts = [BATCH_PROMPTS[i]["prompt"] for i in batch.prompt_indices]
        ref = tok(texts, return_tensors="pt", padding=True)
        assert torch.equal(batch.input_ids, ref.input_ids) and torch.equal(batch.attention_mask, ref.attention_mask)
    first = batches[0]
    assert first.width == 32 and int(first.attention_mask[1].sum()) == 19
    assert (first.input_ids[1, :13] == tok.pad_token_id).all() and (first.attention_mask[1, :13] == 0).all()
    assert [b.prompt_indices for b in make_batches(tok, BATCH_PROMPTS, 8)] == [[0, 1, 2]]
    # no pad token: the EOS token pads; prompts given as ids are padded the same way
    no_pad = SimpleNamespace(pad_token_id=None, eos_token_id=2)
    assert pad_token_id(no_pad) == 2 and pad_token_id(tok) == 0
    (batch,) = make_batches(no_pad, [{"input_ids": [5, 6, 7]}, {"input_ids": [8]}], 2)
    assert batch.input_ids.tolist() == [[5, 6, 7], [2, 2, 8]] and batch.attention_mask.tolist() == [
        [1, 1, 1],
        [0, 0, 1],
    ]
    with pytest.raises(ValueError, match="pad"):
        pad_token_id(SimpleNamespace(pad_token_id=None, eos_token_id=None))


def test_tokens_counted_through_eos():
    """Golden: width-2 prompts; row 0 stops at EOS 9 (kept), its pads are not counted; row 1 never stops."""
    out = torch.tensor([[0, 4, 5, 9, 0, 0], [3, 4, 5, 6, 7, 8], [3, 4, 7, 9, 9, 0]])
    assert stopped_rows(out, 2, {9}) == [[5, 9], [5, 6, 7, 8], [7, 9]]
    assert stopped_rows(out, 2, {7, 9}) == [[5, 9], [5, 6, 7], [7]]
    assert stopped_rows(out, 2, set()) == [[5, 9, 0, 0], [5, 6, 7, 8], [7, 9, 9, 0]]


def test_batch_sizes_parsed():
    assert parse_batch_sizes("1,2,4,8") == [1, 2, 4, 8] and parse_batch_sizes(" 4, 2,2 ") == [2, 4]
    assert parse_batch_sizes(None) == [] and parse_batch_sizes([8, 1]) == [1, 8]
    for bad in ("0,2", "two", "-1"):
        with pytest.raises(ValueError, match="batch sizes"):
            parse_batch_sizes(bad)
    args = build_parser().parse_args(["bench", "--batch-size", "8,1,2"])
    assert bench_config(args).batch_sizes == [1, 2, 8]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--batch-size", "0"])
    # absent: no sweep, and results as before (no new keys)
    config = bench_config(build_parser().parse_args(["bench"]))
    assert config.batch_sizes == [] and "batch_sizes" not in config.to_dict()
    assert "batch_sizes" in BenchConfig(batch_sizes=[2]).to_dict()
    assert "batched" not in BenchResult(config={}, methods=[], records=[], summary={}).to_dict()


def test_every_baseline_batches_or_is_skipped():
    """The baselines outside transformers' assisted loops, and economize run in the core (SuffixDecoding too): they
    batch, with a static cache too (``<strategy>-static``)."""
    assert set(UNBATCHED) <= set(BASELINES)
    assert {
        "plain",
        "plain-kernels",
        "maxgram",
        "maxgram-corpus",
        "hsddw-single",
        "hsddw-every-step",
        "glide-chain",
        "redrafter-w1",
        "redrafter-flat",
        "suffix",
        "suffix-tree",
        "plain-compiled",
        "plain-static",
        *(f"{name}-static" for name in STRATEGIES),
    } == set(BASELINES) - set(UNBATCHED)
    assert skipped(["plain", "pld", "maxgram", "suffix"], 1) == {}
    assert list(skipped(["plain", "pld", "maxgram", "suffix"], 2)) == ["pld"]
    assert skipped(["maxgram-static", "glide-static"], 2) == {}


# -- a sweep on a tiny Llama -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def eos_run():
    """A tiny target whose extra EOS token ends prompt 0 early but not prompt 1 (chosen from its free greedy
    outputs), measured at batch sizes 1 and 2; with the counts expected from those free outputs."""
    model, tok = _llama(0, 2), _tokenizer()
    free = []
    for p in BATCH_PROMPTS:
        ids = tok(p["prompt"], return_tensors="pt").input_ids
        free.append(
            model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW, pad_token_id=0
            )[0, ids.shape[1] :].tolist()
        )
    eos = next(t for k, t in enumerate(free[0]) if k >= 2 and t not in free[0][:k] and t not in free[1])
    model.generation_config.eos_token_id = [2, eos]
    expected = [next((k + 1 for k, t in enumerate(f) if t in (2, eos)), NEW) for f in free]
    assert expected[0] < NEW and expected[1] == NEW
    config = BenchConfig(
        strategy="maxgram,glide",
        baselines=["plain", "plain-kernels", "pld", "maxgram-hf-loop", "glide-chain"],
        max_new_tokens=NEW,
        warmup_tokens=2,
        cost_models=[],
        batch_sizes=[2, 1],
    )
    result = run_benchmark(config, model, tok, BATCH_PROMPTS, strategy_drafts={"glide": [echo_glide(model)]})
    return SimpleNamespace(result=result, eos=eos, expected=expected)


def test_rows_counted_and_equal_to_plain(eos_run):
    r, b = eos_run.result, eos_run.result.batched
    assert not r.errors and not b["errors"] and b["batch_sizes"] == [1, 2]
    assert b["eos_token_ids"] == sorted({2, eos_run.eos}) and b["pad_token_id"] == 0
    # transformers' own prompt lookup (pld) differs from plain on this case under transformers 4.57: not ours
    assert not [m for m in b["mismatches"] if m["method"] != "pld"], b["mismatches"]
    methods = ["plain", "plain-kernels", "pld", "maxgram-hf-loop", "glide-chain", "maxgram", "glide"]
    assert r.methods == methods
    for size, batches in ((1, [[0], [1], [2]]), (2, [[0, 1], [2]])):
        ran = [m for m in methods if m not in skipped(methods, size)]
        for j, rows in enumerate(batches):
            recs = sorted(
                (x for x in b["records"] if x["batch_size"] == size and x["batch_index"] == j), key=lambda x: x["order"]
            )
            assert [x["method"] for x in recs] == ran[j % len(ran) :] + ran[: j % len(ran)]  # rotated per batch
            for x in recs:
                assert x["prompt_indices"] == rows and x["rows"] == len(rows)
                assert x["new_tokens"] == sum(x["row_tokens"])
                if x["method"] != "pld":  # transformers 4.57's prompt lookup runs past this EOS
                    assert x["row_tokens"] == [eos_run.expected[i] for i in rows], (
                        x["method"],
                        size,
                    )  # EOS in, pads out
                    assert x["identical_rows"] == len(rows)
    pair = next(x for x in b["records"] if x["batch_size"] == 2 and x["batch_index"] == 0 and x["method"] == "maxgram")
    assert pair["stats"]["target_calls"] >= 1 and pair["prompt_width"] == 32
    assert pair["verified_tokens"] == pair["new_tokens"]  # BatchStats counts the same tokens


def test_skipped_baselines_noted(eos_run):
    b = eos_run.result.batched
    one, two = b["sizes"]
    assert one["skipped"] == {} and {"pld", "maxgram-hf-loop"} <= set(one["methods"])
    assert set(two["skipped"]) == {"pld", "maxgram-hf-loop"} and "assisted loop" in two["skipped"]["maxgram-hf-loop"]
    assert set(two["methods"]) == {"plain", "plain-kernels", "glide-chain", "maxgram", "glide"}
    table = markdown_batched(b)
    assert "- skipped at batch size 2: **pld** (transformers' prompt lookup runs batch size 1 only)" in table
    assert not [line for line in table.splitlines() if "MISMATCH" in line and "MISMATCH: pld " not in line]


def test_summary_report_json_and_png(eos_run, tmp_path):
    r = eos_run.result
    two = r.batched["sizes"][1]["methods"]
    plain, kernels, maxgram = two["plain"], two["plain-kernels"], two["maxgram"]
    assert (plain["batches"], plain["rows"], plain["identical_rows"]) == (2, 3, 3)
    assert plain["new_tokens"] == sum(eos_run.expected) == maxgram["new_tokens"]
    # plain: one forward per token of each batch's longest row (batch 0's row 1 runs all NEW tokens)
    calls = NEW + eos_run.expected[2]
    assert plain["tokens_per_target_call"] == pytest.approx(sum(eos_run.expected) / calls)
    assert maxgram["tokens_per_target_call"] > 0
    assert plain["vs_plain"] is None and kernels["vs_plain_kernels"] is None
    for s in (maxgram, kernels):
        v = s["vs_plain"]
        assert v["batches"] == 2 and v["geomean_low"] <= v["geomean"] <= v["geomean_high"] and v["throughput_ratio"] > 0
    assert maxgram["vs_plain_kernels"]["batches"] == 2
    report = markdown_report(r)
    assert "### Batched" in report and "| 2 | maxgram | 2 |" in report and "| 1 | pld | 3 |" in report
    assert "### Batched" in report and "### Overall" not in report  # a sweep: no single-prompt tables
    paths = write_results(r, tmp_path)
    data = json.loads(paths["json"].read_text())
    assert data["config"]["batch_sizes"] == [1, 2] and len(data["records"]) == len(r.records)
    assert [e["batch_size"] for e in data["batched"]["sizes"]] == [1, 2]
    assert data["batched"]["sizes"][1]["methods"]["glide"]["identical_rows"] == 3
    png = tmp_path / "speedup_by_batch_size.png"
    assert paths["batch_png"] == png and png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 1000


class _Broken(Method):
    """Plain generate with row 1's last token changed: a method that is not lossless."""

    def run(self, input_ids, attention_mask, gen_kwargs):
        out, _ = super().run(input_ids, attention_mask, gen_kwargs)
        if out.shape[0] > 1:
            out = out.clone()
            out[1, -1] = (out[1, -1] + 1) % 60 + 4
        return out, None


def test_a_row_unlike_plain_is_reported():
    model, tok = _llama(0, 2), _tokenizer()
    methods = {"plain": Method("plain", model, one_forward_per_token=True), "broken": _Broken("broken", model)}
    config = BenchConfig(max_new_tokens=4, warmup_tokens=1, batch_sizes=[2], cost_models=[])
    b = run_batched(config, model, tok, BATCH_PROMPTS, methods)
    assert b["mismatches"] == [{"batch_size": 2, "method": "broken", "batch_index": 0, "prompt_indices": [1]}]
    assert b["sizes"][0]["methods"]["broken"]["identical_rows"] == 2
    assert b["sizes"][0]["methods"]["broken"]["tokens_per_target_call"] is None  # no statistics, not plain
    table = markdown_batched(b)
    assert "| 2 | broken | 2 |" in table and "**2/3 ✗**" in table
    assert "**✗ MISMATCH: broken at batch size 2, batch 0: prompt(s) 1 differ from plain**" in table


def test_versus_golden():
    """Batch 0: b twice as fast as a on the same tokens; batch 1: b emits twice the tokens in a's time."""
    recs = [
        {"batch_index": 0, "method": "a", "seconds": 2.0, "new_tokens": 10},
        {"batch_index": 0, "method": "b", "seconds": 1.0, "new_tokens": 10},
        {"batch_index": 1, "method": "a", "seconds": 1.0, "new_tokens": 5},
        {"batch_index": 1, "method": "b", "seconds": 1.0, "new_tokens": 10},
        {"batch_index": 2, "method": "a", "seconds": 1.0, "new_tokens": 5},
    ]
    v = versus(recs, "b", "a")
    assert v["batches"] == 2 and v["faster_on"] == 2
    assert v["geomean"] == pytest.approx(2.0) and v["throughput_ratio"] == pytest.approx((20 / 2) / (15 / 3))
    assert versus(recs, "a", "a") is None and versus(recs, "b", "missing") is None


def test_cli_notes_skipped_baselines(monkeypatch, tmp_path, capsys):
    """``hf-cascade bench --batch-size``: the skipped baselines are said before the run, the files written; sampling
    makes no equality claim."""
    model, tok = _llama(0, 2), _tokenizer()
    monkeypatch.setattr(loading, "load_model", lambda spec, **placement: (model, tok))
    monkeypatch.setattr(
        loading, "load_prompts", lambda path, per_category, tokenizer=None, prompt_format="plain": BATCH_PROMPTS
    )
    code = main(
        [
            "bench",
            "--strategy",
            "maxgram",
            "--baselines",
            "plain-kernels,pld",
            "--batch-size",
            "2",
            "--max-new-tokens",
            "4",
            "--cost-model",
            "none",
            "--sampling",
            "--no-progress",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    out, err = capsys.readouterr()
    assert "note: pld is skipped for batch sizes above 1 (transformers' prompt lookup" in err
    assert "### Batched" in out and "| 2 | maxgram | 2 |" in out and "n/a |" in out
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["batched"]["sizes"][0]["methods"]["maxgram"]["identical_rows"] is None
    assert (tmp_path / "speedup_by_batch_size.png").is_file()
