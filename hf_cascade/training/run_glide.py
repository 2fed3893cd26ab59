"""``hf-cascade train glide``: train a GLIDE draft model (Du et al., ICML 2024, "GLIDE with a CAPE",
Section 4.1, Appendices B and F) for a frozen target on the distillation data, and the paper's controlled
baseline (Section 5.2, Figure 4): the same architecture without cross-attention, trained the same way.

* The draft (:class:`~hf_cascade.heads.GlideForCausalLM`): ``N_D`` Llama-style layers (1 by default, as the
  paper's 7B/13B drafts, Appendix F), each with a cross-attention over the target's cached K/V of layer
  ``l = N_T - N_D + m`` by default (Gemma-3-270M: 18 layers, layer 17), or the layers ``GlideSpec.target_layer_ids``
  names. Deviation, measured (``docs/results/glide-glimpse-layers-400``): on Gemma-3-270M the last layer's K/V
  raise the draft's acceptance by 0.2 points over no cross-attention, the middle full-attention layer 11's by
  11.5 points, so the shipped head reads layer 11 (``--target-layers 11``); its
  own input embedding and LM head over the ``N`` most frequent target tokens of the data (FR-Spec style,
  as :mod:`.vanilla`), embeddings initialised from the target's like :func:`.vanilla.build_vanilla`, so
  the float32 checkpoint stays within 25 MB.
* Training: block-wise cross-attention mask (block ``L = 5``), weighted cross-entropy on the target's
  greedy responses (:func:`~hf_cascade.training.glide.glide_loss`); the target's K/V per record are
  computed once and reused (:class:`~hf_cascade.training.glide.TargetKVMemo`).
* Held-out metric: teacher-forced greedy acceptance (:func:`~hf_cascade.training.glide.glide_acceptance`:
  ``alpha`` per token, ``tau@5`` per 5-token draft); the best checkpoint is saved in Hub layout with a
  model card (:func:`hf_cascade.heads.hub.save_hub`).

``cross_attention=False`` trains the baseline ("Vanilla Drafter": cross-attention sub-layers removed,
``GlideConfig.cross_attention = False``); it never runs the target, and its acceptance is measured by the
same function, so the two runs' ``trainer_state.json`` / model cards compare directly.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..heads import GlideConfig, GlideForCausalLM
from ..heads.cards import hub_datasets, hub_repo_id, usage_section
from ..heads.hub import save_hub
from .accel import head_device, is_main_process
from .acceptance import GreedyLabels
from .features import FeatureRegression, HeadLoss, require_hidden
from .glide import TargetKVMemo, glide_acceptance, glide_loss
from .loop import TrainConfig, TrainState, iterate_batches, split_records, train, write_state
from .run import _data_facts, _f
from .store import DistillStore
from .vanilla import _as_list, _init_embeddings_from_target
from .vocab import coverage, frequent_subset, token_counts


@dataclass(frozen=True)
class GlideSpec:
    """Architecture and training mask of a GLIDE draft.

    Attributes:
        hidden_size, intermediate_size, num_hidden_layers (``N_D``), num_attention_heads,
        num_key_value_heads, head_dim: the draft's own decoder (the cross-attention's queries take the
            target's head count and size, :meth:`GlideConfig.from_target`).
        draft_vocab_size: ``N``, the most frequent target tokens of the data the draft predicts.
        block_size: ``L`` of the block-wise cross-attention mask (Section 4.1: 5).
        first_block: ``"none"`` (the paper: block 0 sees no target K/V) or ``"causal"`` (the authors' code).
        target_layer_ids: the target layer each draft layer reads; ``None`` = ``l = N_T - N_D + m``.
    """

    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 1
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    draft_vocab_size: int = 8192
    block_size: int = 5
    first_block: str = "none"
    target_layer_ids: tuple[int, ...] | None = None


#: Sizes for Gemma-3-270M (float32 checkpoints: "xs" 22.0 MB, "s" 23.1 MB; the baselines are ~2 MB smaller).
GLIDE_PRESETS: dict[str, GlideSpec] = {
    "xs": GlideSpec(),
    "s": GlideSpec(
        hidden_size=320, intermediate_size=960, num_attention_heads=5, num_key_value_heads=1, draft_vocab_size=6144
    ),
}


def build_glide(
    target, store: DistillStore, spec: GlideSpec, target_name: str = "", cross_attention: bool = True
) -> tuple[GlideForCausalLM, dict]:
    """A fresh GLIDE for ``target`` (``cross_attention=False``: the baseline without the glimpse) with its
    vocabulary subset chosen from ``store``; returns the model and facts for its model card."""
    tc = target.config.get_text_config()
    gc = target.generation_config
    counts = token_counts(store, int(tc.vocab_size))
    specials = [t for t in (gc.bos_token_id, gc.pad_token_id, *_as_list(gc.eos_token_id)) if t is not None]
    subset = frequent_subset(counts, spec.draft_vocab_size, always=specials)
    sizes = {k: v for k, v in asdict(spec).items() if k not in ("first_block", "target_layer_ids")}
    extra = {"target_layer_ids": list(spec.target_layer_ids)} if spec.target_layer_ids else {}
    config = GlideConfig.from_target(
        target,
        **sizes,
        **extra,
        cross_attention=cross_attention,
        target_name_or_path=target_name or None,
        bos_token_id=gc.bos_token_id,
        eos_token_id=gc.eos_token_id,
        pad_token_id=gc.pad_token_id,
    )
    model = GlideForCausalLM(config)
    model.set_vocab_subset(subset)
    _init_embeddings_from_target(model, target, subset)
    facts = {"coverage_all": coverage(counts, subset), "distinct_tokens": int((counts > 0).sum())}
    return model, facts


def train_glide(
    target,
    data: str | Path,
    cfg: TrainConfig,
    spec: GlideSpec,
    target_name: str = "",
    command: str | None = None,
    progress: bool = True,
    cross_attention: bool = True,
    kv_cache_bytes: int = 4 << 30,
) -> tuple[GlideForCausalLM, TrainState]:
    """Train a GLIDE (``cross_attention=False``: the no-cross-attention baseline) on the distillation
    directory ``data``; the best held-out checkpoint goes to ``cfg.out`` in Hub layout with a model card.
    ``kv_cache_bytes`` bounds the memory of the per-record target K/V kept across epochs."""
    store = DistillStore.open(data)
    if len(store) < 2:
        raise ValueError(f"{data} holds {len(store)} sequences; distill more prompts first")
    if store.meta.get("vocab_size") not in (None, int(target.config.get_text_config().vocab_size)):
        raise ValueError(f"{data} was distilled from a target with vocab_size {store.meta['vocab_size']}")
    target.eval().requires_grad_(False)
    model, facts = build_glide(target, store, spec, target_name, cross_attention)
    model.to(head_device(target))
    train_idx, eval_idx = split_records(store, cfg.eval_records)
    command = command or "hf-cascade " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    memo = TargetKVMemo(model, target, kv_cache_bytes)
    labels = GreedyLabels(store, target)
    baseline = None

    def head_loss(m, batch, features=None):
        return glide_loss(
            m,
            target,
            batch,
            spec.block_size,
            spec.first_block,
            kv=memo(batch),
            unroll=cfg.unroll,
            features=features,
            store=store,
        )

    loss_fn = head_loss
    if cfg.feature_weight:
        require_hidden(store)
        regression = FeatureRegression(
            spec.hidden_size, int(target.config.get_text_config().hidden_size), cfg.feature_weight
        ).to(model.device)
        loss_fn = HeadLoss(head_loss, features=regression)

    def eval_fn(m):
        return glide_acceptance(
            m, target, store, eval_idx, max_len=cfg.max_len, block=spec.block_size, kv_fn=memo, labels_fn=labels
        )

    def save_fn(m, state: TrainState):
        extra = {
            "batch_size": cfg.batch_size,
            "spec": asdict(spec),
            "cross_attention": cross_attention,
            "data": _data_facts(store, train_idx, eval_idx),
            "vocab": facts,
            "baseline": baseline,
            "target_kv": {
                "target_tokens": memo.target_tokens,
                "cached_records": len(memo.records),
                "cached_mb": round(memo.bytes / 2**20, 1),
            },
        }
        write_state(state, cfg, cfg.out, extra)
        if state.best is not None and state.best["step"] == state.step:  # keep the best held-out checkpoint
            save_hub(m, cfg.out, _card(m, spec, state, extra, command, baseline, hub_repo_id(cfg.out)))

    if is_main_process():
        with torch.no_grad():
            baseline = eval_fn(model.eval())
    state = train(model, iterate_batches(store, train_idx, cfg), loss_fn, eval_fn, save_fn, cfg, progress)
    return model, state


def _card(
    model: GlideForCausalLM,
    spec: GlideSpec,
    state: TrainState,
    extra: dict,
    command: str,
    baseline: dict | None,
    repo_id: str = "",
) -> dict:
    params = sum(p.numel() for p in model.parameters())
    last = next((h["eval"] for h in reversed(state.history) if "eval" in h), {})
    data, c = extra["data"], model.config
    block = spec.block_size
    tau = f"tau@{block}"
    accept_cols = " | ".join(f"accept@{k}" for k in range(1, block + 1))
    row = lambda d: " | ".join(_f(d, f"accept@{k}") for k in range(1, block + 1))  # noqa: E731
    if c.cross_attention:
        title = "GLIDE draft model"
        what = (
            f"Each layer cross-attends to the target's cached keys/values of layer(s) {c.target_layer_ids} "
            f"({c.target_num_attention_heads} query heads of size {c.target_head_dim}), the *glimpse* of Du et "
            'al. (ICML 2024, "GLIDE with a CAPE", Section 4.1); it was trained with the block-wise '
            f"cross-attention mask (block {block}) that simulates the KV-cache delay of decoding."
        )
    else:
        title = "GLIDE baseline without cross-attention (Vanilla Drafter)"
        what = (
            "The paper's controlled baseline (Section 5.2, Figure 4): the GLIDE architecture with its "
            "cross-attention sub-layers removed, trained on the same data for the same steps; it never "
            "reads the target."
        )
    body = f"""# hf_cascade {title} ({c.target_name_or_path or "target"})

A {spec.num_hidden_layers}-layer draft (hidden {spec.hidden_size}, {params / 1e6:.2f} M parameters, float32) for
speculative decoding with hf_cascade's `GlideAssistant` (GLIDE, optionally with CAPE proposal expansion,
verified as a token tree: greedy output identical to the target's, sampling lossless). {what}
It predicts over the {spec.draft_vocab_size} most frequent target tokens of its training data (coverage
{extra["vocab"]["coverage_all"]:.1%}) and returns full-vocabulary logits (`finfo.min` outside the subset).

## Data
Sequence-level distillation: the target's own greedy responses (at most {data["max_new_tokens"]} new tokens, prompt
template `{data["prompt_format"]!r}`) to {data["sequences"]} training prompts ({data["by_source"]}), {data["tokens"]}
tokens in all. Sources: GSM8K train, Alpaca seed tasks, Vicuna bench questions; Spec-Bench, the benchmark, is never
used. {data["heldout_sequences"]} sequences are held out.

## Training
Data: `hf-cascade distill --out DATA`, then
```
{command}
```
{state.step} steps (this checkpoint: the best held-out evaluation so far), \
batch {extra.get("batch_size", "")} sequences,
{state.seconds / 60:.1f} min on the machine it ran on; target frozen. Loss: cross-entropy on the target's tokens
(prompt positions weighted down), draft positions in block `b` seeing the target's K/V of blocks `< b` only.

## Measured acceptance (held-out, greedy, teacher forced against the target's greedy tokens)
accept@k = share of {block}-token drafts with at least k tokens accepted (by drafted position).

| | alpha (per token) | {tau} (tokens accepted of a {block}-token draft) | {accept_cols} |
|---|---:|---:|{"---:|" * block}
| before training | {_f(baseline, "alpha")} | {_f(baseline, tau)} | {row(baseline)} |
| this checkpoint (step {state.step}) | {_f(last, "alpha")} | {_f(last, tau)} | {row(last)} |

![held-out acceptance by drafted position, per evaluation](acceptance_by_position.png)

{usage_section("glide", repo_id, c.target_name_or_path)}"""
    # no pipeline_tag: the draft cannot generate without the target's K/V
    return {"body": body, "datasets": hub_datasets(data["by_source"]), "sources": data["by_source"]}


__all__ = ["GLIDE_PRESETS", "GlideSpec", "build_glide", "train_glide"]
