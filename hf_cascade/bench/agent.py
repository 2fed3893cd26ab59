"""``hf-cascade bench --workload agent``: Max-Gram with and without the answer memory (``Policy(memory=...)``) on an
agent-style workload, paired call by call.

The workload, from Spec-Bench's questions (the first ``--per-category`` of each category): one *episode* per
question, ``--agent-steps`` separate calls that each ask the same question under another step's scaffold
(:data:`AGENT_STEPS`: an agent re-asking a sub-task with its step header changed, a pipeline re-running a step). No
call's prompt holds an earlier answer, so what a later call repeats of an earlier answer can only come from a memory
of earlier calls. One assistant of each kind serves the whole run (as it would serve an agent: its memory also holds
the earlier episodes' answers), the two run the same call back to back (their order alternating), greedy, and every
pair of outputs must be identical (a mismatch is reported and counted).

Reported: tokens per target call (total new tokens over total target calls: a count, robust to a busy machine), the
wall-time ratio (without over with memory, summed over calls; a timing, as loaded as the machine), each for the first
step of the episodes (a new question: the memory holds other questions' answers only) and for the later steps, and
the memory's drafted and accepted tokens.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

#: One scaffold per step of an episode (``{question}``: the Spec-Bench question's first turn). Step 1 is the bench's
#: plain completion format (:data:`hf_cascade.data.PROMPT_FORMAT`).
AGENT_STEPS = (
    "Question: {question}\n\nAnswer:",
    "Agent step 2. Tools available: search, calculator, python. Task:\n{question}\n\nAnswer:",
    "Agent step 3. The task below was attempted before; solve it again and state the final answer.\n\n"
    "Question: {question}\n\nAnswer:",
    "Agent step 4 (verification). Task: {question}\n\nAnswer:",
)


def agent_episodes(items: list[dict], steps: int) -> list[list[str]]:
    """Per Spec-Bench item, the prompts of its ``steps`` calls (:data:`AGENT_STEPS`)."""
    if not 1 <= steps <= len(AGENT_STEPS):
        raise ValueError(f"--agent-steps must be in 1..{len(AGENT_STEPS)}, got {steps}")
    return [[AGENT_STEPS[s].format(question=item["turns"][0].strip()) for s in range(steps)] for item in items]


def _totals(rows: list[dict], method: str) -> dict:
    tokens = sum(r[method]["new_tokens"] for r in rows)
    calls = sum(r[method]["target_calls"] for r in rows)
    return {
        "calls": len(rows),
        "new_tokens": tokens,
        "target_calls": calls,
        "tokens_per_target_call": tokens / calls if calls else 0.0,
        "seconds": sum(r[method]["seconds"] for r in rows),
    }


def summarize(rows: list[dict]) -> dict:
    """Per group of calls (all, first steps, later steps): each method's totals and the ratios with / without."""
    groups = {
        "all": rows,
        "first step": [r for r in rows if r["step"] == 0],
        "later steps": [r for r in rows if r["step"] > 0],
    }
    out = {}
    for name, group in groups.items():
        if not group:
            continue
        without, with_memory = _totals(group, "without"), _totals(group, "memory")
        out[name] = {
            "without": without,
            "memory": with_memory,
            "tokens_per_call_ratio": with_memory["tokens_per_target_call"] / without["tokens_per_target_call"],
            "speed_ratio": without["seconds"] / with_memory["seconds"],
        }
    out["mismatches"] = [r["index"] for r in rows if not r["identical"]]
    out["memory_tokens_proposed"] = sum(r["memory"]["memory_proposed"] for r in rows)
    out["memory_tokens_accepted"] = sum(r["memory"]["memory_accepted"] for r in rows)
    return out


def report(summary: dict, header: str) -> str:
    lines = [
        header,
        "",
        "| calls | n | tokens/call without | with memory | ratio | speed ratio (timed) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in ("all", "first step", "later steps"):
        if name in summary:
            s = summary[name]
            lines.append(
                f"| {name} | {s['without']['calls']} | {s['without']['tokens_per_target_call']:.2f} | "
                f"{s['memory']['tokens_per_target_call']:.2f} | {s['tokens_per_call_ratio']:.2f}x | "
                f"{s['speed_ratio']:.2f}x |"
            )
    lines += [
        "",
        f"memory drafts: {summary['memory_tokens_accepted']} of {summary['memory_tokens_proposed']} "
        f"tokens accepted; outputs differing: {len(summary['mismatches'])}",
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> int:
    """Run the agent workload (module docstring): load the target, run the episodes, write ``--out`` and print."""
    import torch

    from .. import data
    from ..cascade import CascadeAssistant
    from ..drafters.maxgram import MaxGram
    from ..options import Policy
    from .command import bench_config
    from .loading import load_model, target_placement

    config = bench_config(args)
    memory_tokens = int(getattr(args, "memory", None) or 100_000)
    steps = int(getattr(args, "agent_steps", None) or 3)
    model, tokenizer = load_model(config.target, **target_placement(config))
    episodes = agent_episodes(data.load_specbench(config.prompts_path, per_category=config.per_category), steps)
    log(
        f"agent workload: {len(episodes)} episodes x {steps} calls, {config.max_new_tokens} new tokens, greedy; "
        f"Max-Gram without and with a {memory_tokens}-token memory"
    )
    device = model.get_input_embeddings().weight.device
    without = CascadeAssistant([MaxGram()])
    with_memory = CascadeAssistant([MaxGram()], policy=Policy(memory=memory_tokens))

    def call(assistant, ids) -> tuple[list[int], dict]:
        t0 = time.perf_counter()
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=config.max_new_tokens,
            assistant_model=assistant,
        )
        seconds = time.perf_counter() - t0
        stats = assistant.last_stats
        level = stats.levels[-1] if stats.levels and stats.levels[-1].name == "memory" else None
        return out[0, ids.shape[1] :].tolist(), {
            "new_tokens": stats.new_tokens,
            "target_calls": stats.target_calls,
            "seconds": seconds,
            "memory_proposed": level.tokens_proposed if level else 0,
            "memory_accepted": level.tokens_accepted if level else 0,
        }

    warm = tokenizer("Question: warm up\n\nAnswer:", return_tensors="pt").input_ids.to(device)
    for assistant in (without, with_memory):
        model.generate(
            warm, attention_mask=torch.ones_like(warm), max_new_tokens=8, do_sample=False, assistant_model=assistant
        )
    with_memory.forget()
    rows = []
    for e, episode in enumerate(episodes):
        for s, text in enumerate(episode):
            ids = tokenizer(text, return_tensors="pt").input_ids.to(device)
            order = [("without", without), ("memory", with_memory)]
            if len(rows) % 2:
                order.reverse()
            got = {name: call(assistant, ids) for name, assistant in order}
            rows.append(
                {
                    "index": len(rows),
                    "episode": e,
                    "step": s,
                    "identical": got["without"][0] == got["memory"][0],
                    **{name: record for name, (_, record) in got.items()},
                }
            )
            r = rows[-1]
            log(
                f"episode {e} step {s}: tokens/call {r['without']['new_tokens'] / r['without']['target_calls']:.2f} "
                f"-> {r['memory']['new_tokens'] / r['memory']['target_calls']:.2f}"
                + ("" if r["identical"] else "  MISMATCH")
            )
    summary = summarize(rows)
    text = report(
        summary,
        f"Agent workload ({len(episodes)} Spec-Bench questions x {steps} calls, "
        f"{config.max_new_tokens} new tokens, greedy): Max-Gram with vs without a "
        f"{memory_tokens}-token answer memory, paired",
    )
    out = Path(args.out or "bench_agent")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(
        json.dumps(
            {
                "config": {
                    "episodes": len(episodes),
                    "steps": steps,
                    "max_new_tokens": config.max_new_tokens,
                    "memory": memory_tokens,
                    "per_category": config.per_category,
                },
                "summary": summary,
                "rows": rows,
            },
            indent=1,
        )
    )
    (out / "report.md").write_text(text + "\n")
    print(text)
    return 1 if summary["mismatches"] else 0


__all__ = ["AGENT_STEPS", "agent_episodes", "report", "run", "summarize"]
