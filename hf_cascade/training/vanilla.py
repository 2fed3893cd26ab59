"""``hf-cascade train vanilla``: a small independent causal-LM drafter distilled from the target.

The drafter (:class:`~hf_cascade.heads.CascadeDrafterForCausalLM`) reads and predicts target token
ids over a reduced vocabulary (:mod:`hf_cascade.training.vocab`). It is initialised from the target
where shapes allow: its embedding rows are the target's (scaled) embeddings of the subset tokens,
projected onto their top principal directions when the drafter is narrower (deviation from plain
random init; it speeds up training on small data). Loss: cross-entropy on the target's greedy
tokens (sequence-level distillation), prompt positions down-weighted; with soft labels
(:mod:`.soft_labels`) also cross-entropy against the target's top-K distribution at every position,
prompt positions included (:class:`SoftTerm`).

Held-out metric: greedy acceptance under teacher forcing. For a greedy target, a drafted token
``t`` is accepted iff the drafter's argmax equals the target's token *and* every earlier drafted
token was accepted, in which case the drafter saw exactly the target's prefix; so the per-position
agreement ``alpha`` and the run lengths measured with teacher forcing are the real acceptance.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..heads import CascadeDrafterConfig, CascadeDrafterForCausalLM
from .loop import Batch, make_batch
from .soft_labels import SoftLabels, soft_cross_entropy
from .store import DistillStore
from .vocab import coverage, frequent_subset, token_counts


@dataclass(frozen=True)
class VanillaSpec:
    """Architecture of a vanilla drafter (a Llama-style decoder over ``draft_vocab_size`` tokens)."""

    hidden_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 768
    draft_vocab_size: int = 8192


#: Sizes shipped for Gemma-3-270M (each <= 25 MB in float32).
PRESETS: dict[str, VanillaSpec] = {
    "xs": VanillaSpec(hidden_size=256, num_hidden_layers=1, intermediate_size=768),
    "s": VanillaSpec(hidden_size=256, num_hidden_layers=2, intermediate_size=768),
    "m": VanillaSpec(
        hidden_size=320,
        num_hidden_layers=3,
        num_attention_heads=5,
        num_key_value_heads=1,
        head_dim=64,
        intermediate_size=896,
    ),
}


def build_vanilla(
    target, store: DistillStore, spec: VanillaSpec, target_name: str = ""
) -> tuple[CascadeDrafterForCausalLM, dict]:
    """A fresh drafter for ``target`` with its vocabulary subset chosen from ``store``; returns the
    model and facts for its model card (subset coverage)."""
    tc = target.config.get_text_config()
    gc = target.generation_config
    counts = token_counts(store, int(tc.vocab_size))
    specials = [t for t in (gc.bos_token_id, gc.pad_token_id, *_as_list(gc.eos_token_id)) if t is not None]
    subset = frequent_subset(counts, spec.draft_vocab_size, always=specials)
    config = CascadeDrafterConfig(
        vocab_size=int(tc.vocab_size),
        max_position_embeddings=int(getattr(tc, "max_position_embeddings", 8192)),
        bos_token_id=gc.bos_token_id,
        eos_token_id=gc.eos_token_id,
        pad_token_id=gc.pad_token_id,
        target_name_or_path=target_name,
        **asdict(spec),
    )
    model = CascadeDrafterForCausalLM(config)
    model.set_vocab_subset(subset)
    _init_embeddings_from_target(model, target, subset)
    facts = {"coverage_all": coverage(counts, subset), "distinct_tokens": int((counts > 0).sum())}
    return model, facts


def _as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


@torch.no_grad()
def _init_embeddings_from_target(model: CascadeDrafterForCausalLM, target, subset: torch.Tensor) -> None:
    """Embedding rows ``[:N]`` = the target's embeddings of ``subset`` (times the target's
    embedding scale), projected onto their top ``H`` principal directions, rescaled to the
    backbone's initialisation std. Row ``N`` (out of subset) keeps its random init."""
    emb = target.get_input_embeddings()
    w = emb.weight[subset].float() * float(getattr(emb, "embed_scale", 1.0))  # [N, H_t]
    h = model.config.hidden_size
    w = w - w.mean(dim=0, keepdim=True)
    if w.shape[1] > h:
        _, _, v = torch.pca_lowrank(w, q=h, center=False, niter=4)
        w = w @ v  # [N, H]
    elif w.shape[1] < h:
        w = F.pad(w, (0, h - w.shape[1]))
    w = w * (model.config.initializer_range / w.std().clamp_min(1e-8))
    model.get_input_embeddings().weight[: subset.numel()] = w.to(model.dtype)


@dataclass(frozen=True)
class SoftTerm:
    """The soft-label part of the vanilla loss: ``hard * CE(greedy tokens, response positions only) +
    weight * CE(top-K target distribution, every position; prompt positions x prompt_weight)``."""

    labels: SoftLabels
    store: DistillStore
    weight: float = 1.0
    hard: float = 0.5
    prompt_weight: float = 1.0


def vanilla_loss(
    model: CascadeDrafterForCausalLM, batch: Batch, soft: SoftTerm | None = None
) -> tuple[torch.Tensor, dict]:
    """Weighted next-token cross-entropy over the reduced vocabulary (targets outside it ignored);
    with ``soft``, the combination of :class:`SoftTerm`."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, full_vocab=False).logits  # [B, T, N]
    n = logits.shape[-1]
    labels = model.to_draft_ids(batch.input_ids[:, 1:])  # [B, T-1]
    w = (batch.weights[:, 1:] if soft is None else batch.response[:, 1:].float()) * (labels < n)
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, n), labels.reshape(-1).clamp_max(n - 1), reduction="none").view_as(
        w
    )
    hard = (ce * w).sum() / w.sum().clamp_min(1.0)
    if soft is None:
        return hard, {}
    ids, logp = (t.to(logits.device) for t in soft.labels.rows(soft.store, batch.index, batch.input_ids.shape[1]))
    sce = soft_cross_entropy(logits[:, :-1], ids[:, :-1], logp[:, :-1])  # [B, T-1]
    ws = batch.attention_mask[:, 1:].float() * torch.where(batch.response[:, 1:], 1.0, soft.prompt_weight)
    soft_loss = (sce * ws).sum() / ws.sum().clamp_min(1.0)
    return soft.hard * hard + soft.weight * soft_loss, {"hard": float(hard.detach()), "soft": float(soft_loss.detach())}


@torch.no_grad()
def greedy_acceptance(
    model,
    store: DistillStore,
    index: list[int],
    batch_size: int = 8,
    max_len: int = 512,
    windows: tuple[int, ...] = (4, 8),
) -> dict:
    """Teacher-forced greedy acceptance on the *response* positions of held-out records.

    ``alpha``: fraction of response tokens the drafter's argmax predicts; ``tau@k``: mean number of
    tokens a k-token greedy draft starting at a response position gets accepted (run lengths
    capped at ``k``)."""
    hits: list[np.ndarray] = []
    for s in range(0, len(index), batch_size):
        b = make_batch(store, index[s : s + batch_size], max_len, prompt_weight=0.0).to(model.device)
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask, full_vocab=False).logits  # [B, T, N]
        pred = model.vocab_subset[logits[:, :-1].argmax(-1)]  # [B, T-1] target ids
        ok = (pred == b.input_ids[:, 1:]).cpu().numpy()
        resp = (b.weights[:, 1:] > 0).cpu().numpy()
        for r in range(ok.shape[0]):
            hits.append(ok[r][resp[r]])
    flat = np.concatenate(hits) if hits else np.zeros(0, dtype=bool)
    out = {"alpha": float(flat.mean()) if flat.size else 0.0, "eval_tokens": int(flat.size)}
    for k in windows:
        runs = [_run_lengths(h, k) for h in hits if h.size]
        out[f"tau@{k}"] = float(np.concatenate(runs).mean()) if runs else 0.0
    return out


def _run_lengths(hit: np.ndarray, cap: int) -> np.ndarray:
    """For each position, the number of consecutive hits starting there, capped at ``cap``."""
    run = np.zeros(hit.size + 1, dtype=np.int64)
    for i in range(hit.size - 1, -1, -1):
        run[i] = run[i + 1] + 1 if hit[i] else 0
    return np.minimum(run[:-1], cap)
