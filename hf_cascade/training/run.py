"""``hf-cascade train <head>``: load the frozen target and the distillation data, train a head with
:func:`hf_cascade.training.loop.train`, save checkpoints in Hub layout with a model card.

Heads: ``vanilla`` (:mod:`.vanilla`). ``glide`` and ``redrafter`` plug into the same loop with their
own loss (they need the target's KV cache / hidden states) and are completed by their own issues.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import asdict
from pathlib import Path

from ..heads.cards import hub_datasets, hub_repo_id, usage_section
from ..heads.hub import save_hub
from .accel import head_device, is_main_process, main_process_first
from .loop import TrainConfig, TrainState, iterate_batches, split_records, train, write_state
from .soft_labels import compute_soft_labels
from .store import DistillStore
from .vanilla import PRESETS, SoftTerm, VanillaSpec, build_vanilla, greedy_acceptance, vanilla_loss

HEADS = ("vanilla", "glide", "redrafter")


def train_vanilla(
    target,
    data: str | Path,
    cfg: TrainConfig,
    spec: VanillaSpec,
    target_name: str = "",
    command: str | None = None,
    progress: bool = True,
    soft_labels: int = 0,
) -> tuple[object, TrainState]:
    """Train a vanilla drafter on the distillation directory ``data``; checkpoints go to ``cfg.out``.

    ``soft_labels=K > 0``: first compute (or reuse) the target's top-K distributions over the
    drafter's subset at every position of ``data`` and train with :class:`~.vanilla.SoftTerm`."""
    store = DistillStore.open(data)
    if len(store) < 2:
        raise ValueError(f"{data} holds {len(store)} sequences; distill more prompts first")
    if store.meta.get("vocab_size") not in (None, int(target.config.get_text_config().vocab_size)):
        raise ValueError(f"{data} was distilled from a target with vocab_size {store.meta['vocab_size']}")
    model, facts = build_vanilla(target, store, spec, target_name)
    model.to(head_device(target))
    loss_fn = vanilla_loss
    if soft_labels:
        with main_process_first():  # one process computes the table into the store, the others read it
            table = compute_soft_labels(
                target, store, model.vocab_subset.cpu(), soft_labels, progress=progress and is_main_process()
            )
        soft = SoftTerm(table, store)
        facts["soft_labels"] = soft_labels

        def loss_fn(m, batch):
            return vanilla_loss(m, batch, soft)

    train_idx, eval_idx = split_records(store, cfg.eval_records)
    command = command or "hf-cascade " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    baseline = None

    def eval_fn(m):
        return greedy_acceptance(m, store, eval_idx)

    def save_fn(m, state: TrainState):
        extra = {
            "batch_size": cfg.batch_size,
            "spec": asdict(spec),
            "data": _data_facts(store, train_idx, eval_idx),
            "vocab": facts,
        }
        write_state(state, cfg, cfg.out, extra)
        if state.best is not None and state.best["step"] == state.step:  # keep the best held-out checkpoint
            save_hub(m, cfg.out, _card(m, spec, state, extra, command, baseline, hub_repo_id(cfg.out)))

    baseline = eval_fn(model.eval()) if is_main_process() else None
    state = train(model, iterate_batches(store, train_idx, cfg), loss_fn, eval_fn, save_fn, cfg, progress)
    return model, state


def _data_facts(store: DistillStore, train_idx, eval_idx) -> dict:
    sources: dict[str, int] = {}
    for r in store.records:
        sources[r.source] = sources.get(r.source, 0) + 1
    return {
        "path": str(store.path),
        "sequences": len(store),
        "tokens": store.num_tokens,
        "train_sequences": len(train_idx),
        "heldout_sequences": len(eval_idx),
        "by_source": sources,
        "max_new_tokens": store.meta.get("max_new_tokens"),
        "prompt_format": store.meta.get("prompt_format"),
    }


def _card(
    model, spec: VanillaSpec, state: TrainState, extra: dict, command: str, baseline: dict | None, repo_id: str = ""
) -> dict:
    params = sum(p.numel() for p in model.parameters())
    last = next((h["eval"] for h in reversed(state.history) if "eval" in h), {})
    data = extra["data"]
    body = f"""# hf_cascade vanilla drafter ({model.config.target_name_or_path or "target"})

A {spec.num_hidden_layers}-layer Llama-style drafter (hidden {spec.hidden_size}, {params / 1e6:.2f} M parameters,
float32) for speculative decoding with hf_cascade — `CascadeAssistant([drafter, MaxGram()])`
or transformers' `generate(assistant_model=drafter)`. It predicts over the {spec.draft_vocab_size} most frequent target
tokens of its training data (FR-Spec style; coverage of the data {extra["vocab"]["coverage_all"]:.1%}) and returns
full-vocabulary logits (`finfo.min` outside the subset), so verification stays exact.

## Data
Sequence-level distillation: the target's own greedy responses (at most {data["max_new_tokens"]} new tokens, prompt
template `{json.dumps(data["prompt_format"])}`) to {data["sequences"]} training prompts ({data["by_source"]}),
{data["tokens"]} tokens in all. Sources: GSM8K train, Alpaca seed tasks, Vicuna bench questions. Spec-Bench, the
benchmark, is never used (its questions are filtered out). {data["heldout_sequences"]} sequences are held out.

## Training
Data: `hf-cascade distill --out DATA` (defaults: batch 16, at most 128 new tokens, greedy; resumable), then
```
{command}
```
{state.step} steps (this checkpoint: the best held-out evaluation so far), batch {extra.get("batch_size", "")} \
sequences, {state.seconds / 60:.1f} min on the machine it ran on.
Loss: {_loss_text(extra)}

## Measured acceptance (held-out, greedy, teacher forced = exact greedy acceptance)
| | alpha (per token) | tau@4 | tau@8 |
|---|---:|---:|---:|
| before training | {_f(baseline, "alpha")} | {_f(baseline, "tau@4")} | {_f(baseline, "tau@8")} |
| this checkpoint (step {state.step}) | {_f(last, "alpha")} | {_f(last, "tau@4")} | {_f(last, "tau@8")} |

tau@k = mean accepted tokens of a k-token draft. Speed with the target: see hf_cascade's README (bench tables).

{usage_section("drafter", repo_id, model.config.target_name_or_path)}
Without hf_cascade, as transformers' own assistant: `AutoModelForCausalLM.from_pretrained("{repo_id}",
trust_remote_code=True)` (the modeling files of this repository), then `generate(ids, assistant_model=drafter)`.
"""
    return {
        "body": body,
        "pipeline_tag": "text-generation",
        "datasets": hub_datasets(data["by_source"]),
        "sources": data["by_source"],
    }


def _loss_text(extra: dict) -> str:
    k = extra["vocab"].get("soft_labels")
    if not k:
        return "cross-entropy on the target's tokens (prompt positions weighted down)."
    return (
        f"cross-entropy against the target's top-{k} distribution over the subset at every position, prompt "
        f"positions included (teacher-forced soft labels, `--soft-labels`), plus {SoftTerm.hard:g} x cross-entropy "
        "on the target's greedy tokens at response positions."
    )


def _f(d: dict | None, key: str) -> str:
    return f"{d[key]:.3f}" if d and key in d else "–"


__all__ = ["HEADS", "PRESETS", "train_vanilla"]
