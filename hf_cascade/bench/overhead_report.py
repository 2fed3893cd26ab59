"""The report of ``hf-cascade bench --overhead`` (:mod:`hf_cascade.bench.overhead`): the machine it ran on and the
markdown table; ``results.json`` and ``report.md`` in the output folder."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

import torch

#: The compiled plain baseline's name in the results.
COMPILED = "compiled"

# -- the environment ---------------------------------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; else :func:`platform.processor`)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def git_commit() -> str:
    """The checkout's commit (``+dirty`` with uncommitted changes), ``unknown`` outside a git checkout."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def environment() -> dict:
    import transformers

    return {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "commit": git_commit(),
        "load_average": load_average(),
    }


# -- reporting ---------------------------------------------------------------------------------------------------


def _f(value, spec: str = ".3f") -> str:
    return "–" if value is None else format(value, spec)


def header(result: dict) -> str:
    e, s = result["environment"], result["settings"]
    load = e.get("load_average")
    return (
        f"Machine: {e['cpu']} ({e['logical_cpus']} logical CPUs, load average "
        f"{', '.join(map(str, load)) if load else 'unknown'} at start), {s['threads']} torch thread(s); "
        f"torch {e['torch']}, transformers {e['transformers']}, Python {e['python']}; commit {e['commit']}."
    )


def markdown(result: dict) -> str:
    """The report: the header line, the settings, the table, the compiled baseline, the top read sites."""
    s = result["settings"]
    lines = [
        "# hf-cascade bench --overhead",
        "",
        header(result),
        "",
        f"Tiny target {s['target']}; {len(s['prompts'])} prompts x {s['new_tokens']} new tokens, greedy; "
        f"CPU kernels off; drafting loops on the accelerator schedule (DEFER_READS={s['defer_reads']}); "
        f"best of {s['repeats']} rounds per prompt. Drafters: {s['drafter']}, GLIDE {s['glide']}, ReDrafter "
        f"{s['redrafter']}. Cost rules: {s['cost_rules']}.",
        "",
        "host ms/call: wall time of generate minus time inside the target's decoder forwards, per target call "
        "(a target call is a decoder forward: plain's are tokens; the strategies' first one is a prefill of the "
        "prompt but its last token); of it, the drafter's own forwards. reads/call: tensor reads (.item(), "
        ".tolist(), .cpu(), .numpy(), bool/int/float/index) from the target's first forward on, per target "
        "call, each a host-device sync on a GPU when the tensor lives there (here every tensor is on the host, "
        "so reads of tensors the library builds on the host, such as the accepted path, are counted too: an "
        "upper bound).",
        "",
        "Baseline: plain generate for the eager rows and for compiled plain; **compiled plain** for the "
        '"<strategy>, compiled" rows (their host/call is over compiled plain\'s host ms per token, their '
        "speedup is compiled plain's wall ms per token over theirs). speedup: the baseline's wall ms per token "
        "over the row's.",
        "",
        "| method | tokens/call | host ms/call | of which drafter fwd | host/call ÷ baseline host/token | "
        "reads/call | host ms/token | target fwd ms/call | wall ms/token | speedup over baseline | "
        "identical to plain |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for m in result["methods"].values():
        ident = "yes" if m["identical"] else "**NO**"
        if m["reads"].get("error"):
            ident += f" (reads not counted: {m['reads']['error']})"
        draft = _f(m["draft_forward_ms_per_call"]) if m.get("drafter_timed") else "–"
        lines.append(
            f"| {m['label']} | {_f(m['tokens_per_call'], '.2f')} | {_f(m['host_ms_per_call'])} | {draft} | "
            f"{_f(m['host_vs_plain'], '.2f')}x | {_f(m['reads_per_call'], '.2f')} | "
            f"{_f(m['host_ms_per_token'])} | "
            f"{_f(m['target_forward_ms_per_call'])} | {_f(m['wall_ms_per_token'])} | "
            f"{_f(m.get('speedup'), '.2f')}x{_base(m)} | {ident} |"
        )
    c = result.get("compiled") or {}
    if c:
        lines.append("")
        if "error" in c:
            lines.append(
                f"Compiled plain generate ({json.dumps(c['settings'])}): **failed** after "
                f"{c.get('warmup_seconds', 0):.1f} s: {c['error']}"
            )
        else:
            m = result["methods"].get(COMPILED, {})
            cache = c.get("inductor_cache") or {}
            warm = (
                "; inductor's on-disk cache held compiled code before this run, which shortens the compile"
                if cache.get("existed_before")
                else ""
            )
            skipped = (
                ""
                if c.get("compiled", True)
                else (
                    " **transformers did not compile** (its criteria were not met): the row is the static cache alone;"
                )
            )
            lines.append(
                f"Compiled plain generate ({json.dumps(c['settings'])}):{skipped} warm-up (compile) "
                f"{c['warmup_seconds']:.1f} s{warm}; then {_f(m.get('wall_ms_per_token'))} ms per token "
                f"(plain: {_f(result['methods']['plain']['wall_ms_per_token'])}). Its forward time is the "
                "time inside the compiled call (decoding steps) and the eager prefill's decoder."
            )
    cs = result.get("compiled_strategies")
    if cs is not None:
        lines += ["", _strategies_note(cs)]
    for name, why in result.get("errors", {}).items():
        if name != COMPILED:
            lines.append(f"\n{name}: could not run: {why}")
    lines += ["", "## Where the reads are (per method, all prompts, most frequent first)", ""]
    for name, m in result["methods"].items():
        sites = m["reads"].get("sites") or []
        lines.append(
            f"- **{name}**: {m['reads']['reads']} reads / {m['reads']['forwards_seen']} target calls "
            f"(+{m['reads']['reads_before_first_forward']} before the first forward)"
        )
        for site, n in sites[:6]:
            lines.append(f"  - {n}: `{site}`")
    return "\n".join(lines)


def _base(m: dict) -> str:
    """`` (vs compiled plain)`` after a compiled strategy's speedup."""
    return " (vs compiled plain)" if m.get("baseline") == COMPILED and m.get("speedup") is not None else ""


def _strategies_note(cs: dict) -> str:
    """The compiled strategies' warm-up, graphs, and any strategy whose call did not compile."""
    warm = cs.get("warmup_seconds") or {}
    note = (
        'Compiled strategies (the same assistant, cache_implementation="static", the compiled plain\'s '
        "CompileConfig and max_cache_len; verification through the core's torch.compile'd decoder, whose time "
        "counts as target forward time): warm-up over every prompt (the compile) "
        + ", ".join(f"{n} {t:.1f} s" for n, t in warm.items())
        + "."
    )
    after, timed = cs.get("graphs_after_warmup"), cs.get("graphs_after_timed")
    if after is not None and timed is not None:
        note += (
            " No graph was compiled during the timed rounds."
            if timed == after
            else f" **{timed - after} graph(s) were compiled during the timed rounds** (best of rounds counts)."
        )
    breaks = (cs.get("graph_breaks_after_timed") or 0) - (cs.get("graph_breaks_after_warmup") or 0)
    if breaks:
        note += f" **{breaks} graph break(s) during the timed rounds** (the timers' hooks?)."
    skipped = [n for n, done in (cs.get("compiled") or {}).items() if not done]
    if skipped:
        note += f" **Not compiled** (the core's criteria were not met; eager static rows): {', '.join(skipped)}."
    return note


def write(result: dict, out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "markdown": out / "report.md"}
    paths["json"].write_text(json.dumps(result, indent=1))
    paths["markdown"].write_text(markdown(result) + "\n")
    return paths


__all__ = ["COMPILED", "cpu_model", "environment", "git_commit", "header", "load_average", "markdown", "write"]
