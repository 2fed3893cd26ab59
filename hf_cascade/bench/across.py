"""``hf-cascade bench --compare A B``: runs of the bench made apart (two commits, two checkouts, two machines)
compared prompt by prompt.

One process imports one version of the library, so two commits cannot share one interleaved rotation. What they can
share is a reference that runs inside each: every run times plain ``generate`` on the same prompts, interleaved with
its strategies. The comparison is then a ratio of ratios, per prompt:

    change(s, prompt) = speedup_B(s, prompt) / speedup_A(s, prompt),  speedup_X = time per token of the reference
                                                                        over that of s, both in run X

so a machine that runs one run faster (another core, another load, another hour) cancels out, as long as it runs
the reference and the strategy alike: the rotation inside each run sees to that. Above 1: B's strategy is faster
relative to plain than A's.

The reference is ``plain`` by default: transformers' own loop, the same code in both runs. ``plain-kernels`` runs
hf_cascade's CPU kernels, which are part of what differs between two commits, and it answers to memory-bandwidth load
differently from the strategies (measured: ``docs/results/against-start-00bc32c-6df7105-epyc``). Runs compared should
still be made alike: the same load (two runs at once on two cores, then the cores swapped, pairs their conditions)
and the same choices a run makes once by timing: the output head's block of rows
(:func:`~hf_cascade.backends.cpu.verify_head.calibrate_block_rows`) and the verification profile that sizes the
trees (:func:`~hf_cascade.measure.measured_verify_cost`), both recorded in each run's environment. The comparison lists
each run's, and says so when the head blocks differ.
"""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from pathlib import Path


def _timed_choices(path: str | Path) -> dict:
    path = Path(path)
    path = path / "results.json" if path.is_dir() else path
    return (json.loads(path.read_text()).get("environment") or {}).get("cpu_kernels") or {}


def head_blocks(path: str | Path) -> list[int]:
    """The output-head blocks a bench run's process chose (``environment.cpu_kernels.head_blocks``: each strategy's
    last call's, in the order first chosen; empty when it recorded none)."""
    return [int(b["block_rows"]) for b in _timed_choices(path).get("head_blocks", [])]


def verify_profiles(path: str | Path) -> list[str]:
    """The verification profiles a bench run's process measured (``environment.cpu_kernels.verify_profiles``), each
    as its relative costs at the measured sizes (``"1: 1.05, 2: 1.10, ..."``); empty when it recorded none."""
    return [
        ", ".join(f"{n}: {c:.2f}" for n, c in p["relative"].items() if int(n))
        for p in _timed_choices(path).get("verify_profiles", [])
    ]


def load_records(path: str | Path) -> list[dict]:
    """The per-prompt records of a bench run: its ``results.json``, or the folder that holds it."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"no bench results at {path} (a results.json written by `hf-cascade bench`)")
    records = json.loads(path.read_text()).get("records")
    if not isinstance(records, list):
        raise ValueError(f"{path} holds no per-prompt 'records' (not a `hf-cascade bench` results.json)")
    return records


def _by_prompt(records: list[dict]) -> dict[tuple, dict[str, dict]]:
    runs: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in records:
        runs[(r.get("question_id", r["prompt_index"]), r.get("draw", 0))][r["method"]] = r
    return runs


def _per_token(r: dict) -> float:
    return r["seconds"] / max(r["new_tokens"], 1)


def changes(pairs: list[tuple[list[dict], list[dict]]], reference: str = "plain") -> dict[str, list[float]]:
    """``{strategy: [change per (pair, prompt)]}`` (see the module docstring) for every method other than the
    reference and ``plain`` that both runs of a pair timed on a prompt, with the reference, each time above 0."""
    out: dict[str, list[float]] = defaultdict(list)
    for a_records, b_records in pairs:
        a_runs, b_runs = _by_prompt(a_records), _by_prompt(b_records)
        for key in sorted(set(a_runs) & set(b_runs), key=str):
            a, b = a_runs[key], b_runs[key]
            if reference not in a or reference not in b:
                continue
            for method in sorted(set(a) & set(b) - {reference, "plain"}):
                times = [_per_token(x) for x in (a[reference], a[method], b[reference], b[method])]
                if min(times) > 0:
                    out[method].append((times[2] / times[3]) / (times[0] / times[1]))
    return dict(out)


def geomean_interval(values: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """The geometric mean of ``values`` and its 95% bootstrap interval (``resamples`` resamplings, fixed ``seed``)."""
    logs = [math.log(v) for v in values]
    rng = random.Random(seed)
    means = sorted(sum(logs[rng.randrange(len(logs))] for _ in logs) / len(logs) for _ in range(resamples))
    lo, hi = means[int(0.025 * resamples)], means[min(int(0.975 * resamples), resamples - 1)]
    return math.exp(sum(logs) / len(logs)), math.exp(lo), math.exp(hi)


def same_reference(pairs: list[tuple[list[dict], list[dict]]], reference: str = "plain") -> tuple[int, int]:
    """``(same, compared)``: on how many prompts the reference's output text is the same in both runs of a pair (of
    those where both records keep their text)."""
    same = compared = 0
    for a_records, b_records in pairs:
        a_runs, b_runs = _by_prompt(a_records), _by_prompt(b_records)
        for key in set(a_runs) & set(b_runs):
            a, b = a_runs[key].get(reference), b_runs[key].get(reference)
            if a is not None and b is not None and "output_text" in a and "output_text" in b:
                compared += 1
                same += a.get("output_text") == b.get("output_text")
    return same, compared


def identical(records: list[dict], method: str) -> tuple[int, int]:
    """``(identical, runs)`` of ``method``'s outputs against plain's in one run."""
    mine = [r for r in records if r["method"] == method]
    return sum(bool(r.get("identical_to_plain")) for r in mine), len(mine)


def compare(pairs: list[tuple[list[dict], list[dict]]], reference: str = "plain") -> dict:
    """Every strategy's change from A to B (geometric mean over the pooled prompts, 95% interval, on how many B was
    faster relative to the reference), with the checks of the module docstring."""
    rows = {}
    for method, values in changes(pairs, reference).items():
        g, lo, hi = geomean_interval(values)
        rows[method] = {
            "units": len(values),
            "change": g,
            "low": lo,
            "high": hi,
            "b_faster_on": sum(v > 1 for v in values),
            "per_unit": values,  # what the interval is computed from (pair, prompt order)
            "identical_a": [identical(a, method) for a, _ in pairs],
            "identical_b": [identical(b, method) for _, b in pairs],
        }
    same, compared = same_reference(pairs, reference)
    return {"reference": reference, "pairs": len(pairs), "reference_same_output": [same, compared], "methods": rows}


def markdown(result: dict, names: tuple[str, str] = ("A", "B")) -> str:
    """The table of :func:`compare`."""
    a, b = names
    same, compared = result["reference_same_output"]
    intro = (
        f"Speed over `{result['reference']}` in {b} over that in {a}, per prompt, geometric mean over "
        f"{result['pairs']} pair(s) of runs (above 1: {b} is faster; 95% bootstrap intervals over prompts). "
        f"The reference's outputs were the same text in both runs on {same}/{compared} prompts."
    )
    lines = [
        intro,
        "",
        f"| method | change {b} / {a} | 95% interval | {b} faster on | identical to plain in {a} | in {b} |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for method, row in result["methods"].items():
        ia = ", ".join(f"{i}/{n}" for i, n in row["identical_a"])
        ib = ", ".join(f"{i}/{n}" for i, n in row["identical_b"])
        lines.append(
            f"| {method} | {row['change']:.3f} | {row['low']:.3f}-{row['high']:.3f} | "
            f"{row['b_faster_on']}/{row['units']} | {ia} | {ib} |"
        )
    return "\n".join(lines) + "\n"


def run(paths: list[str], out: str | Path, reference: str = "plain", log=print) -> int:
    """``hf-cascade bench --compare A B [A2 B2 ...]``: write ``compare.json`` and ``compare.md`` in ``out``, print
    the table."""
    if len(paths) < 2 or len(paths) % 2:
        raise ValueError(f"--compare takes pairs of runs (A B [A2 B2 ...]), got {len(paths)} path(s)")
    pairs = [(load_records(paths[i]), load_records(paths[i + 1])) for i in range(0, len(paths), 2)]
    result = compare(pairs, reference)
    if not result["methods"]:
        raise ValueError(f"the runs share no prompt on which both timed {reference!r} and a strategy")
    result["runs"] = [[paths[i], paths[i + 1]] for i in range(0, len(paths), 2)]
    result["head_blocks"] = [[head_blocks(paths[i]), head_blocks(paths[i + 1])] for i in range(0, len(paths), 2)]
    result["verify_profiles"] = [
        [verify_profiles(paths[i]), verify_profiles(paths[i + 1])] for i in range(0, len(paths), 2)
    ]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(result, indent=1))
    table = markdown(result)
    differ = [f"{x} against {y}" for x, y in result["head_blocks"] if x != y]
    if differ:
        table += (
            f"\nThe runs of a pair chose different output-head blocks ({'; '.join(differ)}; each strategy's last "
            "call's): priced from a cost curve timed once per process, they change the speeds compared.\n"
        )
    profiles = [
        f"pair {k + 1}: A {'; '.join(x) or '-'}, B {'; '.join(y) or '-'}"
        for k, (x, y) in enumerate(result["verify_profiles"])
        if x or y
    ]
    if profiles:
        table += (
            "\nVerification profiles (relative cost of verifying n nodes, measured once per process; they size "
            "the trees): " + " | ".join(profiles) + "\n"
        )
    (out / "compare.md").write_text(
        "Runs (A, B): " + "; ".join(f"`{x}`, `{y}`" for x, y in result["runs"]) + "\n\n" + table
    )
    log(f"wrote {out / 'compare.md'}")
    print(table)
    return 0


__all__ = [
    "changes",
    "compare",
    "geomean_interval",
    "head_blocks",
    "load_records",
    "markdown",
    "run",
    "same_reference",
    "verify_profiles",
]
