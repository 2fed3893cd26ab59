"""PNG figures of a benchmark summary (matplotlib with the Agg backend, no display needed)."""

from __future__ import annotations

from pathlib import Path

from .summary import KERNELS, OVERALL


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_acceptance_by_position(summary: dict, path: str | Path, min_proposed: int = 5) -> Path | None:
    """Acceptance rate at the target by position in the draft (CS Drafting, Figure 2), one line per
    method that reports it; for cascades also each level's acceptance by its reviewer (dashed).
    Positions proposed fewer than ``min_proposed`` times are left out. ``None`` when no method reports it."""
    acc = summary.get("acceptance_by_position") or {}
    if not acc:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for method, data in acc.items():
        t = data["target"]
        xs = [i + 1 for i, p in enumerate(t["proposed"]) if p >= min_proposed]
        ys = [t["rates"][i - 1] for i in xs]
        reviews = t["proposed"][0] if t["proposed"] else 0
        ax.plot(xs, ys, marker="o", label=f"{method}: accepted by target ({reviews} drafts)")
        levels = data.get("levels", {})
        if len(levels) > 1:  # a real cascade: show how each drafter fares with its reviewer
            for key, lv in levels.items():
                lx = [i + 1 for i, p in enumerate(lv["proposed"]) if p >= min_proposed]
                if lx:
                    ax.plot(
                        lx,
                        [lv["rates"][i - 1] for i in lx],
                        ls="--",
                        marker=".",
                        label=f"{method} level {key} (by its reviewer)",
                    )
    ax.set_xlabel("position of the token in the draft")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.02)
    ax.set_title("Acceptance of draft tokens by position")
    ax.grid(alpha=0.3)
    return _save(fig, ax, path)


def plot_speedup_by_category(summary: dict, methods: list[str], path: str | Path) -> Path:
    """One figure of every method's speed per category and overall (grouped bars, one per method): speedup vs
    plain (total time) and, when ``plain-kernels`` ran, below it the speed relative to plain-kernels, with
    the 1.0 line each method must clear."""
    plt = _pyplot()
    groups = list(summary["categories"]) + [OVERALL]
    kernels = KERNELS in methods
    panels = [("speedup", "speedup vs plain generate", [m for m in methods if m != "plain"])]
    if kernels:
        panels.append(
            ("speedup_vs_plain_kernels", "speed / plain-kernels", [m for m in methods if m not in ("plain", KERNELS)])
        )
    colors = _colors(plt, [m for m in methods if m != "plain"])

    def value(group: str, m: str, key: str) -> float:
        s = summary[OVERALL].get(m) if group == OVERALL else summary["categories"][group].get(m)
        return (s or {}).get(key) or 0.0

    width_in = max(7.0, min(16.0, 2.5 + 0.2 * len(groups) * max(4, len(panels[0][2]))))
    fig, axes = plt.subplots(len(panels), 1, figsize=(width_in, 4.2 * len(panels)), squeeze=False)
    for ax, (key, label, names) in zip(axes[:, 0], panels):
        width = 0.8 / max(1, len(names))
        for j, m in enumerate(names):
            xs = [g + (j - (len(names) - 1) / 2) * width for g in range(len(groups))]
            ax.bar(xs, [value(g, m, key) for g in groups], width=width, label=m, color=colors[m])
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(groups, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, ncol=2 if len(names) > 6 else 1)
    axes[0, 0].set_title("Speed per category (same prompts, interleaved)")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _colors(plt, names: list[str]) -> dict:
    """One colour per method, the same in every panel (tab10, tab20 beyond ten methods)."""
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    return {m: cmap(i % cmap.N) for i, m in enumerate(names)}


def plot_window_per_step(records: list[dict], path: str | Path, prompt_index: int | None = None) -> Path | None:
    """Tokens handed to the target at each verification step on one prompt (HSDDW, Figure 8), one line
    per method that reports it (``stats["window_per_step"]``, else ``draft_len_per_call``).
    ``prompt_index``: default the first prompt with such data. ``None`` when no method reports it."""

    def windows(rec: dict) -> list[int] | None:
        stats = rec.get("stats") or {}
        return stats.get("window_per_step", stats.get("draft_len_per_call"))

    with_data = [r for r in records if windows(r)]
    if prompt_index is None and with_data:
        prompt_index = with_data[0]["prompt_index"]
    chosen = [r for r in with_data if r["prompt_index"] == prompt_index]
    if not chosen:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for rec in chosen:
        w = windows(rec)
        ax.step(range(1, len(w) + 1), w, where="mid", marker=".", label=f"{rec['method']} (mean {sum(w) / len(w):.2f})")
    ax.set_xlabel("verification step of the target")
    ax.set_ylabel("window (tokens handed to the target)")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_title(f"Window size per step, prompt {prompt_index} ({chosen[0].get('category', '')})")
    ax.grid(alpha=0.3)
    return _save(fig, ax, path)


def plot_speedup_by_batch_size(batched: dict, path: str | Path) -> Path:
    """The batched sweep (:func:`~hf_cascade.bench.batched.run_batched`): speedup vs batch size, one line per
    method, each point the geometric mean over batches of its throughput relative to plain-kernels (to plain
    when plain-kernels did not run) with its 95% bootstrap interval as error bars; the dashed 1.0 line is
    the reference."""
    plt = _pyplot()
    sizes = batched["sizes"]
    key, reference = (
        ("vs_plain_kernels", KERNELS) if any(KERNELS in e["methods"] for e in sizes) else ("vs_plain", "plain")
    )
    names = list(dict.fromkeys(m for e in sizes for m in e["methods"] if m != reference))
    colors = _colors(plt, names)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for j, m in enumerate(names):
        points = [(e["batch_size"], e["methods"][m][key]) for e in sizes if (e["methods"].get(m) or {}).get(key)]
        if not points:
            continue
        ys = [v["geomean"] for _, v in points]
        err = [
            [max(y - v["geomean_low"], 0.0) for y, (_, v) in zip(ys, points)],
            [max(v["geomean_high"] - y, 0.0) for y, (_, v) in zip(ys, points)],
        ]
        shift = 2 ** (0.04 * (j - (len(names) - 1) / 2))  # side by side, so the bars do not overlap
        ax.errorbar([b * shift for b, _ in points], ys, yerr=err, marker="o", capsize=3, label=m, color=colors[m])
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ticks = [e["batch_size"] for e in sizes]
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(b) for b in ticks])
    ax.set_xticks([], minor=True)
    ax.set_xlabel("batch size")
    ax.set_ylabel(f"throughput / {reference} (geo-mean over batches)")
    ax.set_title("Speedup vs batch size (95% bootstrap intervals over batches)")
    ax.grid(alpha=0.3)
    return _save(fig, ax, path)


def _save(fig, ax, path: str | Path) -> Path:
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)
    return path
