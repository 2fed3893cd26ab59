"""Table + plot of the max_window sweep (hf-cascade bench --window W, W in 4, 8, 16)."""
import json, sys
from pathlib import Path
import matplotlib; matplotlib.use("Agg"); import matplotlib.pyplot as plt
dirs = {int(p.split("window")[1].split("-")[0]): Path(p) for p in sys.argv[2:]}
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
rows = {}
for w, d in sorted(dirs.items()):
    s = json.loads((d / "results.json").read_text())["summary"]["overall"]
    rows[w] = {m: (s[m]["speedup"], s[m]["speedup_mean_per_prompt"], s[m].get("tokens_per_target_call")) for m in s}
names = {"hf-assisted-constant": "vanilla SD (transformers assisted, constant window)", "hsddw": "HSDDW Algorithm 1 (max_window)"}
lines = ["| method | " + " | ".join(f"window {w}" for w in rows) + " | max/min |", "|---|" + "---:|" * (len(rows) + 1)]
for m, label in names.items():
    vals = [rows[w][m][0] for w in rows]
    lines.append(f"| {label} | " + " | ".join(f"{v:.2f}x" for v in vals) + f" | {max(vals)/min(vals):.2f} |")
lines.append("")
lines.append("Speedup = total time of plain / total time of the method, same run; per-prompt means: " + "; ".join(
    f"window {w}: " + ", ".join(f"{m} {rows[w][m][1]:.2f}x" for m in names) for w in rows))
(out / "sweep.md").write_text("\n".join(lines) + "\n"); print("\n".join(lines))
fig, ax = plt.subplots(figsize=(5.5, 3.5))
for m, label in names.items():
    ax.plot(list(rows), [rows[w][m][0] for w in rows], "o-", label=label)
ax.axhline(1.0, color="gray", lw=0.8, ls="--"); ax.set_xscale("log", base=2); ax.set_xticks(list(rows)); ax.set_xticklabels([str(w) for w in rows])
ax.set_xlabel("window (max_window / num_assistant_tokens)"); ax.set_ylabel("speedup vs plain"); ax.legend(fontsize=7); ax.set_title("Speedup across window sizes (drafter-xs, Gemma-3-270M)", fontsize=9)
fig.tight_layout(); fig.savefig(out / "speedup_vs_window.png", dpi=110)
