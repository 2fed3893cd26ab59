"""Turn a :class:`~hf_cascade.bench.runner.BenchResult` into files and text (returned, not printed)."""

from __future__ import annotations

import json
from pathlib import Path

from .plots import (
    plot_acceptance_by_position,
    plot_speedup_by_batch_size,
    plot_speedup_by_category,
    plot_window_per_step,
)
from .runner import BenchResult
from .summary import COMPILED, KERNELS, OVERALL
from .swi import COST_MODELS


def _fmt(value, spec: str = ".2f", none: str = "–") -> str:
    return none if value is None else format(value, spec)


def _identical(s: dict) -> str:
    return "n/a" if s["identical"] is None else f"{s['identical']}/{s['prompts']}"


def _has_kernels(result: BenchResult) -> bool:
    return KERNELS in result.methods


def _cost_models(result: BenchResult) -> list[str]:
    """The SWI cost models of the run (in the summary's groups)."""
    found = {c for s in result.summary[OVERALL].values() if s for c in s.get("swi", {})}
    return [c for c in COST_MODELS if c in found]


def _swi(s: dict, models: list[str]) -> str:
    """``"1.91 / 1.40"``: the group's SWI per cost model, ``–`` where unavailable."""
    return " / ".join(_fmt(s.get("swi", {}).get(c)) for c in models)


def markdown_overall(result: BenchResult) -> str:
    """One row per method: tokens/s, both speedups (and the speed relative to plain-kernels when it ran), the SWI
    per cost model, tokens per target call, identical outputs."""
    kernels = _has_kernels(result)
    compiled = COMPILED in result.methods
    models = _cost_models(result)
    swi_head = "".join(f" SWI ({c}) |" for c in models)
    lines = [
        "| method | prompts | tok/s | speedup (total time per token) | speedup (mean per prompt) | "
        + ("speed / plain-kernels |" if kernels else "")
        + ("speed / plain-compiled |" if compiled else "")
        + swi_head
        + " tok/target call | identical to plain |",
        "|---|---:|---:|---:|---:|"
        + ("---:|" if kernels else "")
        + ("---:|" if compiled else "")
        + "---:|" * len(models)
        + "---:|---:|",
    ]
    for m in result.methods:
        s = result.summary[OVERALL].get(m)
        if s is None:
            continue
        rel = f" {_fmt(s.get('speedup_vs_plain_kernels'))}x |" if kernels else ""
        rel += f" {_fmt(s.get('speedup_vs_plain_compiled'))}x |" if compiled else ""
        swi = "".join(f" {_fmt(s.get('swi', {}).get(c))} |" for c in models)
        lines.append(
            f"| {m} | {s['prompts']} | {_fmt(s['tokens_per_second'], '.1f')} | {_fmt(s['speedup'])}x | "
            f"{_fmt(s['speedup_mean_per_prompt'])}x |{rel}{swi} {_fmt(s['tokens_per_target_call'])} | {_identical(s)} |"
        )
    return "\n".join(lines)


def markdown_categories(result: BenchResult) -> str:
    """Categories x methods: speedup (total time) and tokens/s; tokens per call for methods that report it;
    beside each speedup the SWI per cost model."""
    methods = [m for m in result.methods if m != "plain"]
    models = _cost_models(result)
    swi_head = f" SWI ({' / '.join(models)})" if models else ""
    head = (
        "| category | plain tok/s | "
        + " | ".join(f"{m} speedup" + (f" | {m}{swi_head}" if models else "") for m in methods)
        + " |"
    )
    lines = [head, "|---|---:|" + "---:|" * (len(methods) * (2 if models else 1))]
    for cat, per_method in result.summary["categories"].items():
        plain = per_method.get("plain")
        cells = []
        for m in methods:
            s = per_method.get(m)
            if s is None:
                cells += ["–"] * (2 if models else 1)
                continue
            cell = f"{s['speedup']:.2f}x"
            if s["tokens_per_target_call"] is not None:
                cell += f" ({s['tokens_per_target_call']:.2f} t/c)"
            if s["identical"] is not None and s["identical"] != s["prompts"]:
                cell += f" [{s['identical']}/{s['prompts']} same]"
            cells.append(cell)
            if models:
                cells.append(_swi(s, models))
        plain_tps = _fmt(plain["tokens_per_second"], ".1f") if plain else "–"
        lines.append(f"| {cat} | {plain_tps} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def below_kernels(result: BenchResult, methods: list[str] | None = None) -> list[tuple[str, str, float]]:
    """``(method, category, speed)`` of every category (and ``overall``) where a method (default: every one
    but the references) is slower than plain-kernels in total time."""
    methods = [m for m in (methods or result.methods) if m not in ("plain", KERNELS, COMPILED)]
    groups = {**result.summary["categories"], OVERALL: result.summary[OVERALL]}
    return [
        (m, cat, s["speedup_vs_plain_kernels"])
        for cat, per in groups.items()
        for m in methods
        if (s := per.get(m)) and s.get("speedup_vs_plain_kernels") is not None and s["speedup_vs_plain_kernels"] < 1.0
    ]


def markdown_kernels(result: BenchResult) -> str | None:
    """Categories (and ``overall``) x methods: speed relative to plain-kernels (its total time over the
    method's); a cell below 1.00x is bold with a ✗, and under sampling also gives the method's tokens there (sampled
    outputs that end within a few tokens measure the prompt's prefill, not decoding). ``None`` when plain-kernels
    did not run."""
    if not _has_kernels(result):
        return None
    methods = [m for m in result.methods if m not in ("plain", KERNELS)]
    lines = ["| category | " + " | ".join(methods) + " |", "|---|" + "---:|" * len(methods)]
    groups = {**result.summary["categories"], OVERALL: result.summary[OVERALL]}
    for cat, per in groups.items():
        cells = []
        for m in methods:
            value = (per.get(m) or {}).get("speedup_vs_plain_kernels")
            tokens = f" ({per[m]['new_tokens']} tokens)" if result.config.get("sampling") and value is not None else ""
            cell = "–" if value is None else f"{value:.2f}x"
            cells.append(f"**{cell}** ✗{tokens}" if value is not None and value < 1.0 else cell)
        lines.append(f"| {'**overall**' if cat == OVERALL else cat} | " + " | ".join(cells) + " |")
    strategies = result.config.get("strategies") or [result.methods[-1]]
    slow = below_kernels(result, [m for m in methods if m in strategies])
    lines += [
        "",
        "Strategies below 1.00x plain-kernels: " + "; ".join(f"{m} on {c} ({v:.2f}x)" for m, c, v in slow)
        if slow
        else "Every strategy is at least 1.00x plain-kernels on every category.",
    ]
    return "\n".join(lines)


def markdown_paired(result: BenchResult) -> str | None:
    """One row per compared pair ``a/b``: ``a``'s time over ``b``'s (above 1: ``b`` is faster), total and
    geometric mean of per-prompt ratios, each with its 95% bootstrap interval over prompts."""
    pairs = result.summary.get("paired") or {}
    if not pairs:
        return None
    lines = [
        "| a / b | time-per-token ratio (total) | 95% interval | geo-mean per prompt | 95% interval | b faster on |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for k, v in pairs.items():
        geo = f"{v['geomean']:.3f} | {v['geomean_low']:.3f}-{v['geomean_high']:.3f}" if "geomean" in v else "– | –"
        lines.append(
            f"| {k} | {v['ratio']:.3f} | {v['low']:.3f}-{v['high']:.3f} | {geo} | {v['faster_on']}/{v['prompts']} |"
        )
    return "\n".join(lines)


def markdown_tree(result: BenchResult) -> str | None:
    """Tree strategies, per target call: nodes verified, output-head rows computed and calls, verification and
    drafting time (``None`` when no method verifies trees)."""
    trees = result.summary.get("tree_verification", {})
    if not trees:
        return None
    lines = [
        "| method | nodes/call | head rows/call | head calls/call | verify ms/call | draft ms/call | draft / verify |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for m, t in trees.items():
        lines.append(
            f"| {m} | {t['nodes_per_call']:.1f} | {t['head_rows_per_call']:.1f} | "
            f"{t.get('head_calls_per_call', 0):.2f} | "
            f"{t['verify_ms_per_call']:.0f} | "
            f"{t['draft_ms_per_call']:.1f} | {_fmt(t['draft_fraction_of_verify'], '.1%')} |"
        )
    return "\n".join(lines)


def _versus(v: dict | None) -> str:
    return "–" if v is None else f"{v['geomean']:.2f}x ({v['geomean_low']:.2f}-{v['geomean_high']:.2f})"


def markdown_batched(batched: dict) -> str:
    """The batched sweep: one row per batch size and method (tokens/s; speedup vs plain and vs plain-kernels,
    geo-mean over batches with its 95% interval; tokens per batched target call; rows identical to plain's),
    then the skipped methods, every row that differs from plain's (in bold) and the errors."""
    lines = [
        "| batch size | method | batches | tok/s | speedup vs plain (95% interval) | "
        "speedup vs plain-kernels (95% interval) | tok/target call | identical rows |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    skips: dict[str, tuple[str, list[int]]] = {}
    for entry in batched["sizes"]:
        for m, why in entry["skipped"].items():
            skips.setdefault(m, (why, []))[1].append(entry["batch_size"])
        for m, s in entry["methods"].items():
            same = s["identical_rows"]
            ident = (
                "n/a" if same is None else f"{same}/{s['rows']}" if same == s["rows"] else f"**{same}/{s['rows']} ✗**"
            )
            lines.append(
                f"| {entry['batch_size']} | {m} | {s['batches']} | {_fmt(s['tokens_per_second'], '.1f')} | "
                f"{_versus(s['vs_plain'])} | {_versus(s['vs_plain_kernels'])} | "
                f"{_fmt(s['tokens_per_target_call'])} | {ident} |"
            )
    lines += [
        "",
        "Tokens: each row's through its first EOS (pads after it not counted); speedup: the geometric mean "
        "over batches of the method's throughput over the reference's (a row of the table: all its batches; "
        "the last batch of a size may be shorter); tok/target call: the batch's tokens per batched forward.",
    ]
    notes = [
        f"- skipped at batch size {', '.join(map(str, sizes))}: **{m}** ({why})" for m, (why, sizes) in skips.items()
    ]
    notes += [
        f"- **✗ MISMATCH: {x['method']} at batch size {x['batch_size']}, batch {x['batch_index']}: prompt(s) "
        f"{', '.join(map(str, x['prompt_indices']))} differ from plain**"
        for x in batched["mismatches"]
    ]
    notes += [f"- could not run: **{m}**: {msg}" for m, msg in batched["errors"].items()]
    return "\n".join(lines + ([""] + notes if notes else []))


_SWI_NOTE = (
    "SWI: standardized walltime improvement (CS Drafting, Section 5.1): plain's standardized time per "
    "generated token over the method's, each forward charged a fixed cost: *params* its model's parameter "
    "count (a verification of any number of rows: one target forward), *measured* this machine's per-row "
    "costs (see `costs` in results.json); – = unavailable."
)


def markdown_report(result: BenchResult) -> str:
    """The full Markdown report: settings, overall table, per-category tables (speedup vs plain; speed relative
    to plain-kernels when it ran), paired ratios, tree verification, the batched sweep when it ran, errors."""
    c = result.config
    mode = f"sampling (temperature {c['temperature']}, seed {c['seed']})" if c["sampling"] else "greedy"
    if c.get("prompt_format") == "chat":
        mode += ", chat prompts (the target tokenizer's chat template)"
    if c.get("draws", 1) > 1:
        mode += f", {c['draws']} draws per prompt (each its own seed; a table's prompts count the runs)"
    env = result.environment
    target = env.get("target", {})
    parts = [
        f"**Target** {target.get('class', '?')} ({target.get('parameters', 0) / 1e6:.0f}M params), "
        f"**{'strategies' if ',' in c['strategy'] else 'strategy'}** `{c['strategy']}`, "
        f"{c['max_new_tokens']} new tokens, {mode}, "
        f"torch {env.get('torch', '?')} / transformers {env.get('transformers', '?')}, "
        f"{env.get('threads', '?')} threads.",
        *_device_line(env.get("device")),
        *_kernel_line(env.get("cpu_kernels")),
    ]
    if not result.records and result.batched is not None:  # a batched sweep: no single-prompt runs
        return "\n".join(
            parts
            + [
                "",
                "### Batched (left-padded batches of consecutive prompts, methods interleaved per batch)",
                "",
                markdown_batched(result.batched),
            ]
            + _errors(result)
        )
    parts += [
        "",
        "### Overall",
        "",
        markdown_overall(result),
        "",
        *([_SWI_NOTE, ""] if _cost_models(result) else []),
        "### Per category (speedup vs plain on the same prompts; t/c = tokens per target call)",
        "",
        markdown_categories(result),
    ]
    kernels = markdown_kernels(result)
    if kernels is not None:
        parts += [
            "",
            "### Per category: speed relative to plain-kernels (its time per token over the method's; ✗ = below 1.00x)",
            "",
            kernels,
        ]
    pairs = markdown_paired(result)
    if pairs is not None:
        parts += [
            "",
            "### Paired: a's time per token over b's on the same prompts (above 1: b is faster; 95% bootstrap "
            "intervals over prompts)",
            "",
            pairs,
        ]
    tree = markdown_tree(result)
    if tree is not None:
        parts += ["", "### Tree verification (per target call; head rows: output-head rows computed)", "", tree]
    if result.batched is not None:
        parts += [
            "",
            "### Batched (left-padded batches of consecutive prompts, methods interleaved per batch)",
            "",
            markdown_batched(result.batched),
        ]
    return "\n".join(parts + _errors(result))


def _device_line(device: dict | None) -> list[str]:
    """Where the target ran (:func:`~hf_cascade.bench.runner.device_description`; none in results written before)."""
    if not device:
        return []
    where = ", ".join(
        filter(
            None,
            (
                device.get("name"),
                device.get("dtype"),
                device.get("attn_implementation") and f"attention {device['attn_implementation']}",
            ),
        )
    )
    return [f"**Device** `{device['device']}` ({where})."]


def _kernel_line(choices: dict | None) -> list[str]:
    """The CPU kernels' once-per-process choices, where they made any (every method of the run shares them)."""
    choices = choices or {}
    parts = [
        f"output-head block {b['block_rows']} rows" + (f" ({b['kind']}, last call)" if b.get("kind") else "")
        for b in choices.get("head_blocks", [])
    ]
    for s in choices.get("screens", []):
        sizes = ", ".join(k for k, used in s["faster"].items() if used) or "no size"
        parts.append(f"screen product {s['product']}, used at {sizes}")
    for p in choices.get("verify_profiles", []):
        r = p.get("rounds") or {}
        rounds = f" (median of {r['measured'] + r['kept']} rounds, {r['kept']} kept from earlier runs)" if r else ""
        parts.append(
            "verification profile " + ", ".join(f"{n}: {c:.2f}" for n, c in p["relative"].items() if int(n)) + rounds
        )
    return ["Choices timed once in this process: " + "; ".join(parts) + "."] if parts else []


def _errors(result: BenchResult) -> list[str]:
    if not result.errors:
        return []
    return ["", "### Methods that could not run", ""] + [f"- **{m}**: {msg}" for m, msg in result.errors.items()]


def write_results(result: BenchResult, out_dir: str | Path) -> dict[str, Path]:
    """Write ``results.json``, ``report.md`` and the PNGs (acceptance by position, speedup per category,
    speedup by batch size after a batched sweep, window per step) into ``out_dir``; return their paths by kind."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "markdown": out / "report.md"}
    paths["json"].write_text(json.dumps(result.to_dict(), indent=1))
    paths["markdown"].write_text(markdown_report(result) + "\n")
    if result.records:  # single-prompt runs (not in a batched sweep)
        acc = plot_acceptance_by_position(result.summary, out / "acceptance_by_position.png")
        if acc is not None:
            paths["acceptance_png"] = acc
        paths["speedup_png"] = plot_speedup_by_category(result.summary, result.methods, out / "speedup_by_category.png")
    if result.batched is not None:
        paths["batch_png"] = plot_speedup_by_batch_size(result.batched, out / "speedup_by_batch_size.png")
    windows = plot_window_per_step(result.records, out / "window_per_step.png")
    if windows is not None:
        paths["window_png"] = windows
    return paths
