"""``hf-cascade train redrafter``: train a ReDrafter head (:class:`~hf_cascade.heads.ReDrafterModel`)
for a frozen target on the distillation data, keep the best held-out checkpoint in Hub layout.

Cheng et al. (2024), "Recurrent Drafter for Fast Speculative Decoding in Large Language Models",
Section 2 and the reference trainer (``apple/ml-recurrent-drafter``, ``train/``): at every position
``t`` the head reads the target's last hidden state ``x_t`` and, teacher-forced on the true tokens,
predicts the ``L`` tokens after the target's own next token (:func:`~.redrafter.redrafter_loss`, the
sum of the ``L`` per-step cross-entropies). Held-out metric: :func:`~.redrafter.redrafter_acceptance`
(exact greedy acceptance of the head's beam-width-1 draft; ``alpha = tau / L``).

Kept small and cheap (deviations from the reference recipe, which trains a full-vocabulary head with
``exit_dim = 2H`` on GPUs):

* the head predicts only the ``N`` most frequent tokens of the data (FR-Spec style, as the vanilla
  drafter; :mod:`.vocab`) through ``input_proj`` to ``exit_dim < 2H``, so it ships in <= 25 MB;
  the target's embedding table is not copied: at run time the head reads the target's own embeddings;
* the frozen target runs once per record: its last hidden states are computed before training (one
  pass over the data, ``logits_to_keep=1``: no vocabulary projection) and kept in memory, unless the
  store already holds them (``hf-cascade distill --hidden-states``).
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from tqdm.auto import tqdm

from ..heads import ReDrafterConfig, ReDrafterModel
from ..heads.cards import hub_datasets, hub_repo_id, usage_section
from ..heads.hub import save_hub
from .accel import head_device, is_main_process
from .acceptance import GreedyLabels
from .features import FeatureRegression, HeadLoss, require_hidden
from .loop import TrainConfig, TrainState, iterate_batches, make_batch, split_records, train, write_state
from .redrafter import redrafter_acceptance, redrafter_loss, target_context
from .run import _data_facts, _f
from .store import DistillStore
from .vocab import coverage, frequent_subset, token_counts


@dataclass(frozen=True)
class ReDrafterSpec:
    """Architecture and draft length of a ReDrafter head.

    Attributes:
        exit_dim: width of the residual blocks (``input_proj`` maps ``[x, s]``, ``2H``, to it).
        num_draft_layers: residual blocks before the vocabulary projection.
        draft_vocab_size: ``N``, target tokens the head predicts (the most frequent of the data;
            capped at the target's vocabulary).
        rnn: ``s_i = SiLU(U s_{i-1} + W e_i + b)`` (``False``: the paper's ``s_i = s_{i-1} + e_i``).
        beam_length: ``L``, draft tokens trained and evaluated per position (use the same
            ``beam_length`` in :class:`~hf_cascade.redrafter.ReDrafterAssistant`).
    """

    exit_dim: int = 384
    num_draft_layers: int = 2
    draft_vocab_size: int = 8192
    rnn: bool = True
    beam_length: int = 5


#: Sizes for Gemma-3-270M (H = 640), float32. On its distillation data the 4096 / 8192 most frequent
#: tokens cover 99.1% / 100% of the (response-weighted) tokens. "xs": ~9 MB, ~2.5x cheaper to train;
#: "s": ~19 MB.
PRESETS: dict[str, ReDrafterSpec] = {
    "xs": ReDrafterSpec(exit_dim=256, num_draft_layers=1, draft_vocab_size=4096),
    "s": ReDrafterSpec(exit_dim=384, num_draft_layers=2, draft_vocab_size=8192),
}
DEFAULT_PRESET = "s"


def build_redrafter(
    target, store: DistillStore, spec: ReDrafterSpec, target_name: str = ""
) -> tuple[ReDrafterModel, dict]:
    """A fresh head for ``target`` (its ``V`` and ``H``) whose vocabulary subset is chosen from
    ``store``; returns it and facts for its model card (subset coverage, size)."""
    tc = target.config.get_text_config()
    gc = target.generation_config
    vocab = int(tc.vocab_size)
    n = min(spec.draft_vocab_size, vocab)
    counts = token_counts(store, vocab)
    eos = gc.eos_token_id if isinstance(gc.eos_token_id, (list, tuple)) else [gc.eos_token_id]
    specials = [t for t in (gc.bos_token_id, gc.pad_token_id, *eos) if t is not None]
    subset = frequent_subset(counts, n, always=specials)
    config = ReDrafterConfig(
        vocab_size=vocab,
        hidden_size=int(tc.hidden_size),
        exit_dim=spec.exit_dim,
        num_draft_layers=spec.num_draft_layers,
        rnn=spec.rnn,
        draft_vocab_size=n,
        target_name_or_path=target_name,
    )
    head = ReDrafterModel(config)
    head.set_vocab_subset(subset)
    params = sum(p.numel() for p in head.parameters())
    facts = {
        "coverage_all": coverage(counts, subset),
        "distinct_tokens": int((counts > 0).sum()),
        "parameters": int(params),
        "size_mb": round(params * 4 / 1e6, 2),
    }
    return head, facts


class _HiddenCache:
    """``store`` with its targets' last hidden states in memory: what :func:`target_context` and
    :func:`redrafter_acceptance` read from a store distilled with hidden states."""

    def __init__(self, store: DistillStore, hidden: np.ndarray):
        self._store, self._hidden = store, hidden
        self.hidden_size = hidden.shape[1]

    def hidden(self) -> np.ndarray:
        return self._hidden  # [num_tokens, H]

    def __len__(self) -> int:
        return len(self._store)

    def __getattr__(self, name):
        return getattr(self._store, name)


@torch.no_grad()
def cache_hidden_states(
    target, store: DistillStore, index: list[int], batch_size: int = 8, progress: bool = False
) -> _HiddenCache:
    """One pass of the frozen target over the records ``index`` (whole records, shortest first):
    their last hidden states ``[num_tokens, H]`` (float32, rows at the store's token offsets)."""
    h = int(target.config.get_text_config().hidden_size)
    hidden = np.zeros((store.num_tokens, h), dtype=np.float32)
    order = sorted(index, key=lambda i: store.records[i].length)
    probe = SimpleNamespace(dtype=torch.float32, device=torch.device("cpu"))  # target_context's output dtype/device
    longest = max((store.records[i].length for i in index), default=1)
    for s in tqdm(range(0, len(order), batch_size), desc="target hidden states", disable=not progress):
        batch = make_batch(store, order[s : s + batch_size], longest, prompt_weight=0.0)
        x, _ = target_context(probe, target, batch)  # [B, T, H]
        for row, i in enumerate(batch.index):
            r = store.records[i]
            hidden[r.offset : r.offset + r.length] = x[row, : r.length].numpy()
    return _HiddenCache(store, hidden)


def train_redrafter(
    target,
    data: str | Path,
    cfg: TrainConfig,
    spec: ReDrafterSpec | None = None,
    target_name: str = "",
    command: str | None = None,
    progress: bool = True,
    cache_hidden: bool | None = None,
) -> tuple[ReDrafterModel, TrainState]:
    """Train a ReDrafter head on the distillation directory ``data``; the best held-out checkpoint
    (Hub layout, model card, ``trainer_state.json``, training curve) goes to ``cfg.out``.

    ``cache_hidden``: compute the target's hidden states once before training (``None``: when they
    fit in 2 GB of memory; ignored when the store holds hidden states)."""
    spec = spec or PRESETS[DEFAULT_PRESET]
    store = DistillStore.open(data)
    if len(store) < 2:
        raise ValueError(f"{data} holds {len(store)} sequences; distill more prompts first")
    tc = target.config.get_text_config()
    if store.meta.get("vocab_size") not in (None, int(tc.vocab_size)):
        raise ValueError(f"{data} was distilled from a target with vocab_size {store.meta['vocab_size']}")
    if store.hidden_size and store.hidden_size != int(tc.hidden_size):
        raise ValueError(f"{data} holds hidden states of size {store.hidden_size}, the target's are {tc.hidden_size}")
    head, facts = build_redrafter(target, store, spec, target_name)
    head.to(head_device(target))
    train_idx, eval_idx = split_records(store, cfg.eval_records)
    command = command or "hf-cascade " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    L = spec.beam_length

    source = store
    hidden_from = "store" if store.hidden_size else "target"
    if not store.hidden_size:
        if cache_hidden is None:
            cache_hidden = store.num_tokens * int(tc.hidden_size) * 4 <= 2e9
        if cache_hidden:
            source = cache_hidden_states(target, store, sorted(train_idx + eval_idx), progress=progress)
            hidden_from = "cached"
    with_hidden = source.hidden_size > 0

    labels = GreedyLabels(store, target)

    def head_loss(m, batch, features=None):
        return redrafter_loss(m, target, batch, L, source if with_hidden else None, cfg.unroll, features)

    loss_fn = head_loss
    if cfg.feature_weight:
        require_hidden(source)
        h = int(tc.hidden_size)
        loss_fn = HeadLoss(head_loss, features=FeatureRegression(h, h, cfg.feature_weight).to(head.device))

    def eval_fn(m):
        return redrafter_acceptance(m, target, source, eval_idx, L, use_store_hidden=with_hidden, labels_fn=labels)

    baseline = None

    def save_fn(m, state: TrainState):
        extra = {
            "batch_size": cfg.batch_size,
            "spec": asdict(spec),
            "data": _data_facts(store, train_idx, eval_idx),
            "vocab": facts,
            "hidden_states": hidden_from,
            "baseline": baseline,
        }
        write_state(state, cfg, cfg.out, extra)
        if state.best is not None and state.best["step"] == state.step:  # keep the best held-out checkpoint
            save_hub(m, cfg.out, _card(m, spec, state, extra, command, baseline, hub_repo_id(cfg.out)))

    baseline = eval_fn(head.eval()) if is_main_process() else None
    state = train(head, iterate_batches(store, train_idx, cfg), loss_fn, eval_fn, save_fn, cfg, progress)
    return head, state


def _card(
    model, spec: ReDrafterSpec, state: TrainState, extra: dict, command: str, baseline: dict | None, repo_id: str = ""
) -> dict:
    cfg = model.config
    last = next((h["eval"] for h in reversed(state.history) if "eval" in h), {})
    data, vocab, L = extra["data"], extra["vocab"], spec.beam_length
    accept_cols = " | ".join(f"accept@{k}" for k in range(1, L + 1))
    row = lambda d: " | ".join(_f(d, f"accept@{k}") for k in range(1, L + 1))  # noqa: E731
    body = f"""# hf_cascade ReDrafter head ({cfg.target_name_or_path or "target"})

A recurrent draft head (Cheng et al., 2024, "Recurrent Drafter for Fast Speculative Decoding in Large
Language Models") for hf_cascade's `ReDrafterAssistant`: from the target's last hidden state and its
token embeddings, `s_i = SiLU(U s_(i-1) + W e_i + b)`, then `[x, s_i]` -> `input_proj` (to {cfg.exit_dim}) ->
{cfg.num_draft_layers} residual blocks -> the {cfg.draft_vocab_size} most frequent target tokens of the training data
(coverage {vocab["coverage_all"]:.1%}). {vocab["parameters"] / 1e6:.2f} M parameters, float32
({vocab["size_mb"]:.1f} MB); it does not copy the target's embedding table (it reads the target's at run time).
Beam search over the head and tree verification keep outputs exact: greedy output equals the target's,
sampling follows the target's distribution.

## Data
Sequence-level distillation: the target's own greedy responses (at most {data["max_new_tokens"]} new tokens, prompt
template `{json.dumps(data["prompt_format"])}`) to {data["sequences"]} training prompts ({data["by_source"]}),
{data["tokens"]} tokens in all. Sources: GSM8K train, Alpaca seed tasks, Vicuna bench questions. Spec-Bench, the
benchmark, is never used (its questions are filtered out). {data["heldout_sequences"]} sequences are held out.

## Training
Data: `hf-cascade distill --out DATA`, then
```
{command}
```
{state.step} steps (this checkpoint: the best held-out evaluation so far), \
batch {extra.get("batch_size", "")} sequences,
{state.seconds / 60:.1f} min on the machine it ran on (target hidden states: {extra.get("hidden_states")}).
Loss: the sum over the {L} draft steps of the cross-entropy of the target's tokens, teacher-forced on them
(the reference trainer's loss; prompt positions weighted down).

## Measured acceptance (held-out, greedy, beam width 1, teacher forced = exact greedy acceptance)
tau = mean accepted draft tokens of an {L}-token draft (a target call then yields 1 + tau tokens); accept@k =
fraction of drafts with at least k tokens accepted. Beam search (width > 1) accepts more.

| | alpha = tau/{L} | tau | {accept_cols} |
|---|---:|---:|{"---:|" * L}
| before training | {_f(baseline, "alpha")} | {_f(baseline, "tau")} | {row(baseline)} |
| this checkpoint (step {state.step}) | {_f(last, "alpha")} | {_f(last, "tau")} | {row(last)} |

![held-out acceptance by drafted position, per evaluation](acceptance_by_position.png)

{usage_section("redrafter", repo_id, cfg.target_name_or_path, beam_length=L)}"""
    # no pipeline_tag: the head cannot generate without the target's hidden states
    return {"body": body, "datasets": hub_datasets(data["by_source"]), "sources": data["by_source"]}


__all__ = ["DEFAULT_PRESET", "PRESETS", "ReDrafterSpec", "build_redrafter", "cache_hidden_states", "train_redrafter"]
