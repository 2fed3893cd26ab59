"""Aggregate per-prompt records into per-category and overall numbers (pure functions on dicts)."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from statistics import mean

from .swi import COST_MODELS, group_swi

OVERALL = "overall"
#: The second reference of every speedup: plain ``generate`` inside hf_cascade's CPU kernels (when it ran).
KERNELS = "plain-kernels"
#: The third: plain ``generate`` with a static cache, compiled (when it ran): what a GPU user compares with.
COMPILED = "plain-compiled"


def _relative(by_prompt: dict[int, dict[str, dict]], method: str, reference: str) -> float | None:
    """``method``'s throughput over ``reference``'s on the prompts where both ran (``None``: none): the ratio of
    total times per generated token (:func:`_speed_ratio`)."""
    pairs = [(p[reference], p[method]) for p in by_prompt.values() if reference in p and method in p]
    return _speed_ratio(pairs) if pairs else None


def _speed_ratio(pairs: list[tuple[dict, dict]]) -> float:
    """``b``'s tokens per second over ``a``'s, over record pairs ``(a, b)``: the ratio of total seconds when both
    generated the same tokens (greedy: identical outputs), and a fair speed ratio when they did not (sampled
    outputs end at different lengths: a run that stopped early is not faster for it)."""
    a_s, b_s = sum(a["seconds"] for a, _ in pairs), sum(b["seconds"] for _, b in pairs)
    a_t, b_t = sum(a["new_tokens"] for a, _ in pairs), sum(b["new_tokens"] for _, b in pairs)
    return (a_s / max(a_t, 1)) / (b_s / max(b_t, 1)) if b_s > 0 else 0.0


def _per_token(record: dict) -> float:
    return record["seconds"] / max(record["new_tokens"], 1)


def cost_models(records: list[dict]) -> list[str]:
    """The SWI cost models the records carry standardized times for (:func:`~hf_cascade.bench.swi.record_times`)."""
    seen = {m for r in records for m in r.get("standardized_time", {})}
    return [m for m in COST_MODELS if m in seen]


def _group_summary(records: list[dict], method: str) -> dict | None:
    """Numbers of ``method`` over the prompts of ``records`` where both it and plain ran."""
    by_prompt: dict[int, dict[str, dict]] = defaultdict(dict)
    for r in records:
        by_prompt[r["prompt_index"]][r["method"]] = r
    pairs = [(p["plain"], p[method]) for p in by_prompt.values() if "plain" in p and method in p]
    if not pairs:
        return None
    mine = [m for _, m in pairs]
    seconds = sum(m["seconds"] for m in mine)
    tokens = sum(m["new_tokens"] for m in mine)
    ratios = [_per_token(p) / _per_token(m) for p, m in pairs if m["seconds"] > 0]
    same = [m["identical_to_plain"] for m in mine]
    stats = [m["stats"] for m in mine if m.get("stats")]
    if method == "plain":
        per_call = 1.0
    elif stats and sum(s["target_calls"] for s in stats):
        # Over the assisted loop: tokens produced / target forwards (the prefill's first token included).
        per_call = sum(s["new_tokens"] for s in stats) / sum(s["target_calls"] for s in stats)
    else:
        per_call = None
    return {
        "prompts": len(pairs),
        "new_tokens": tokens,
        "seconds": seconds,
        "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
        "speedup": _speed_ratio(pairs),
        "speedup_mean_per_prompt": mean(ratios) if ratios else 0.0,
        "speedup_vs_plain_kernels": _relative(by_prompt, method, KERNELS),
        "speedup_vs_plain_compiled": _relative(by_prompt, method, COMPILED),
        "tokens_per_target_call": per_call,
        "identical": None if any(s is None for s in same) else sum(bool(s) for s in same),
        "swi": group_swi(pairs, cost_models(records)),
    }


def _add_counts(total: dict, counts: dict) -> None:
    for key in ("proposed", "accepted"):
        values = counts.get(key, [])
        have = total.setdefault(key, [])
        have.extend([0] * (len(values) - len(have)))
        for i, v in enumerate(values):
            have[i] += v


def _rates(counts: dict) -> list[float]:
    return [a / p if p else 0.0 for a, p in zip(counts["accepted"], counts["proposed"])]


def acceptance_by_position(records: list[dict], method: str) -> dict | None:
    """Summed acceptance counts at the target by draft position (and per drafter level) for ``method``."""
    stats = [r["stats"] for r in records if r["method"] == method and r.get("stats")]
    target: dict = {}
    levels: dict[str, dict] = {}
    for s in stats:
        if "acceptance_by_position" in s:
            _add_counts(target, s["acceptance_by_position"])
        for depth, lv in enumerate(s.get("levels", [])):
            key = f"{depth}:{lv['name']}"
            _add_counts(levels.setdefault(key, {}), lv.get("acceptance_by_position", {}))
    if not target:
        return None
    target["rates"] = _rates(target)
    for counts in levels.values():
        counts.setdefault("proposed", [])
        counts.setdefault("accepted", [])
        counts["rates"] = _rates(counts)
    return {"target": target, "levels": levels}


def tree_verification(records: list[dict], method: str) -> dict | None:
    """Per target call of a tree strategy, summed over its prompts: tree nodes verified, output-head
    rows computed and head calls, milliseconds of verification (forward + acceptance) and of drafting, and drafting
    time as a fraction of verification time. ``None`` for methods without tree statistics."""
    stats = [r["stats"] for r in records if r["method"] == method and r.get("stats") and "head_rows" in r["stats"]]
    calls = sum(s["target_calls"] for s in stats)
    if not calls:
        return None
    phase = lambda s, *names: sum(s.get("phase_seconds", {}).get(n, 0.0) for n in names)  # noqa: E731
    verify = sum(phase(s, "verify", "accept") for s in stats)
    draft = sum(phase(s, "draft") for s in stats)
    return {
        "calls": calls,
        "nodes_per_call": sum(sum(s["tree_sizes"]) for s in stats) / calls,
        "head_rows_per_call": sum(sum(s["head_rows"]) for s in stats) / calls,
        "head_calls_per_call": sum(sum(s.get("head_calls", [])) for s in stats) / calls,
        "verify_ms_per_call": 1000 * verify / calls,
        "draft_ms_per_call": 1000 * draft / calls,
        "draft_fraction_of_verify": draft / verify if verify > 0 else None,
    }


def paired(records: list[dict], a: str, b: str, resamples: int = 2000, seed: int = 0) -> dict | None:
    """``a``'s time per generated token over ``b``'s on the prompts where both ran (above 1: ``b`` is faster;
    greedy outputs are identical, so this is the ratio of times), with 95% bootstrap intervals over prompts
    (``resamples`` resamplings of the prompts, fixed ``seed``): ``ratio`` / ``low`` / ``high`` of the totals
    (:func:`_speed_ratio`), ``geomean`` / ``geomean_low`` / ``geomean_high`` of the per-prompt ratios
    (their geometric mean: every prompt weighs the same, long or short), and on how many prompts ``b`` was
    faster (``faster_on``). Methods run interleaved on each prompt, so the ratios are free of the machine's
    drift between prompts."""
    runs: dict[int, dict[str, dict]] = defaultdict(dict)
    for r in records:
        runs[r["prompt_index"]][r["method"]] = r
    records_ab = [
        (t[a], t[b]) for t in runs.values() if a in t and b in t and t[a]["seconds"] > 0 and t[b]["seconds"] > 0
    ]
    if not records_ab:
        return None
    pairs = [(_per_token(x), _per_token(y)) for x, y in records_ab]
    rng = random.Random(seed)
    totals, geomeans = [], []
    for _ in range(resamples):
        picks = [rng.randrange(len(pairs)) for _ in pairs]
        totals.append(_speed_ratio([records_ab[i] for i in picks]))
        geomeans.append(_geomean([pairs[i] for i in picks]))
    totals.sort()
    geomeans.sort()
    lo, hi = int(0.025 * resamples), min(int(0.975 * resamples), resamples - 1)
    return {
        "prompts": len(pairs),
        "ratio": _speed_ratio(records_ab),
        "low": totals[lo],
        "high": totals[hi],
        "geomean": _geomean(pairs),
        "geomean_low": geomeans[lo],
        "geomean_high": geomeans[hi],
        "faster_on": sum(y < x for x, y in pairs),
    }


def _geomean(pairs: list[tuple[float, float]]) -> float:
    return math.exp(sum(math.log(x / y) for x, y in pairs) / len(pairs))


def paired_names(methods: list[str], strategies: list[str] | None = None) -> list[tuple[str, str]]:
    """The ``(a, b)`` pairs :func:`summarize` compares: every baseline (a method that is not one of ``strategies``)
    against every strategy, and ``maxgram`` against ``cascade`` when both are strategies. ``strategies``
    ``None``: the last method is the only strategy."""
    strategies = methods[-1:] if strategies is None else [m for m in methods if m in strategies]
    baselines = [m for m in methods if m not in strategies]
    pairs = [(b, s) for s in strategies for b in baselines]
    if "maxgram" in strategies and "cascade" in strategies:
        pairs.append(("maxgram", "cascade"))
    return pairs


def summarize(records: list[dict], methods: list[str], strategies: list[str] | None = None) -> dict:
    """``{"overall": {method: numbers}, "categories": {category: {method: numbers}},
    "acceptance_by_position": {method: {"target": counts, "levels": {...}}},
    "tree_verification": {method: numbers}, "paired": {"a/b": numbers}}`` (tree numbers for tree strategies
    only; ``paired``: the pairs of :func:`paired_names`, each as :func:`paired`; ``strategies``: which of
    ``methods`` are ours, default the last one).

    ``speedup`` is the method's tokens per second over plain's on the same prompts (total times per generated
    token, :func:`_speed_ratio`: under greedy the ratio of total times), ``speedup_vs_plain_kernels``
    the same against ``plain-kernels`` (``None`` when it did not run), ``speedup_vs_plain_compiled`` against
    ``plain-compiled``; ``speedup_mean_per_prompt`` the mean of
    per-prompt ratios to plain (times per token); ``identical`` counts outputs equal to plain's (``None`` when
    sampling); ``swi`` the standardized walltime improvement per cost model (plain's standardized time per generated
    token over the method's, each totalled over the same prompts, ``None`` when unavailable;
    :mod:`hf_cascade.bench.swi`).
    """
    categories = list(dict.fromkeys(r["category"] for r in records))
    out: dict = {OVERALL: {}, "categories": {}, "acceptance_by_position": {}, "tree_verification": {}, "paired": {}}
    for m in methods:
        out[OVERALL][m] = _group_summary(records, m)
        tree = tree_verification(records, m)
        if tree is not None:
            out["tree_verification"][m] = tree
        acc = acceptance_by_position(records, m)
        if acc is not None:
            out["acceptance_by_position"][m] = acc
    for a, b in paired_names(methods, strategies):
        pair = paired(records, a, b)
        if pair is not None:
            out["paired"][f"{a}/{b}"] = pair
    for c in categories:
        group = [r for r in records if r["category"] == c]
        out["categories"][c] = {m: _group_summary(group, m) for m in methods}
    return out
