"""``hf-cascade bench --compare``: runs made apart compared prompt by prompt through a reference both timed
(hf_cascade.bench.across). Golden values on hand-made records."""

from __future__ import annotations

import json
import math

import pytest

from hf_cascade.bench import across
from hf_cascade.cli import main


def _record(qid, method, seconds, tokens=10, text="x", identical=True):
    return {
        "prompt_index": qid,
        "question_id": qid,
        "draw": 0,
        "category": "c",
        "method": method,
        "seconds": seconds,
        "new_tokens": tokens,
        "output_text": text,
        "identical_to_plain": identical,
    }


def _run(times: dict[int, dict[str, float]], **kw) -> list[dict]:
    return [_record(q, m, s, **kw) for q, methods in times.items() for m, s in methods.items()]


# A: the strategy is 2x the reference on prompt 1, 4x on prompt 2. B (a machine twice as slow on prompt 2):
# 3x on prompt 1 (change 1.5), 4x on prompt 2 (change 1.0)
A = _run(
    {1: {"plain": 9.0, "plain-kernels": 4.0, "maxgram": 2.0}, 2: {"plain": 9.0, "plain-kernels": 8.0, "maxgram": 2.0}}
)
B = _run(
    {1: {"plain": 9.0, "plain-kernels": 6.0, "maxgram": 2.0}, 2: {"plain": 18.0, "plain-kernels": 16.0, "maxgram": 4.0}}
)


def test_changes_are_ratios_of_speedups_over_the_reference():
    assert across.changes([(A, B)], reference="plain-kernels") == {"maxgram": [pytest.approx(1.5), pytest.approx(1.0)]}
    # against plain (the default): maxgram 4.5x -> 4.5x on both; plain-kernels 2.25x -> 1.5x, then 1.125x -> 1.125x
    assert across.changes([(A, B)]) == {
        "maxgram": [pytest.approx(1.0), pytest.approx(1.0)],
        "plain-kernels": [pytest.approx(2 / 3), pytest.approx(1.0)],
    }


def test_compare_pools_pairs_and_checks_outputs():
    b_other = [dict(r, output_text="y") if r["method"] == "plain-kernels" and r["question_id"] == 2 else r for r in B]
    result = across.compare([(A, B), (A, b_other)], reference="plain-kernels")
    row = result["methods"]["maxgram"]
    assert row["units"] == 4 and row["b_faster_on"] == 2
    assert row["change"] == pytest.approx(math.sqrt(1.5))  # geometric mean of 1.5, 1, 1.5, 1
    assert row["low"] <= row["change"] <= row["high"]
    assert row["identical_a"] == [(2, 2), (2, 2)]
    assert result["reference_same_output"] == [3, 4]


def test_prompts_without_the_reference_do_not_count():
    a = [r for r in A if not (r["question_id"] == 2 and r["method"] == "plain-kernels")]
    assert across.changes([(a, B)], reference="plain-kernels") == {"maxgram": [pytest.approx(1.5)]}


def test_cli_writes_the_table(tmp_path):
    for name, records in (("a", A), ("b", B)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({"records": records}))
    out = tmp_path / "cmp"
    assert (
        main(
            [
                "bench",
                "--compare",
                str(tmp_path / "a"),
                str(tmp_path / "b"),
                "--reference",
                "plain-kernels",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads((out / "compare.json").read_text())
    assert result["methods"]["maxgram"]["change"] == pytest.approx(math.sqrt(1.5))
    assert "| maxgram | 1.225 |" in (out / "compare.md").read_text()
    assert "different output-head blocks" not in (out / "compare.md").read_text()


def test_cli_says_when_the_head_blocks_differ(tmp_path):
    """Each run records the output-head block its process chose by timing; the comparison lists them and says so
    when the two runs of a pair differ."""
    for name, records, block, at16 in (("a", A, 8, 1.9), ("b", B, 3, 1.25)):
        (tmp_path / name).mkdir()
        env = {
            "cpu_kernels": {
                "head_blocks": [{"weight": [96, 32], "threads": 1, "block_rows": block}],
                "verify_profiles": [{"profile": "cpu", "relative": {"0": 1.0, "4": 1.2, "16": at16}}],
            }
        }
        (tmp_path / name / "results.json").write_text(json.dumps({"records": records, "environment": env}))
    out = tmp_path / "cmp"
    assert main(["bench", "--compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)]) == 0
    assert json.loads((out / "compare.json").read_text())["head_blocks"] == [[[8], [3]]]
    assert "different output-head blocks ([8] against [3]; each strategy" in (out / "compare.md").read_text()
    assert json.loads((out / "compare.json").read_text())["verify_profiles"] == [
        [["4: 1.20, 16: 1.90"], ["4: 1.20, 16: 1.25"]]
    ]
    assert "pair 1: A 4: 1.20, 16: 1.90, B 4: 1.20, 16: 1.25" in (out / "compare.md").read_text()


def test_bad_input_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="pairs of runs"):
        across.run([str(tmp_path)], tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="no bench results"):
        across.run([str(tmp_path / "a"), str(tmp_path / "b")], tmp_path / "out")
    (tmp_path / "x.json").write_text(json.dumps({"methods": {}}))
    with pytest.raises(ValueError, match="records"):
        across.load_records(tmp_path / "x.json")
    (tmp_path / "y.json").write_text(json.dumps({"records": _run({1: {"plain-kernels": 1.0, "maxgram": 0.5}})}))
    with pytest.raises(ValueError, match="share no prompt"):
        across.run([str(tmp_path / "y.json"), str(tmp_path / "y.json")], tmp_path / "out")
