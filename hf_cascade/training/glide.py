"""GLIDE training (Du et al., ICML 2024, "GLIDE with a CAPE", Section 4.1 and Appendix B).

The target is frozen: one forward without gradients (``use_cache=True``) over the batch yields its KV cache,
from which each draft layer ``m`` reads layer ``l = N_T - N_D + m``, and its greedy predictions (for the
acceptance metric). The draft then runs over the same tokens with the block-wise cross-attention mask
(:func:`~hf_cascade.heads.glide.modeling_glide.glide_cross_mask`, blocks of ``L = 5``): a position in block
``b`` sees only the target's K/V of blocks ``< b``, as at decoding time after ``b * L`` verified tokens. Loss:
next-token cross-entropy on the batch tokens (the target's greedy responses in a distillation store),
weighted by ``batch.weights``; tokens outside a reduced draft vocabulary are ignored.

Greedy acceptance with teacher forcing (:func:`glide_acceptance`): with that mask, a draft of ``L`` tokens
started at a block start ``p`` sees exactly what it would see in decoding after the target verified ``p``
tokens, so the run of consecutive agreements with the target's greedy predictions from ``p`` is the number
of tokens such a draft gets accepted.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import torch
import torch.nn.functional as F

from ..heads.glide import GlideForCausalLM, glide_cross_mask
from .loop import Batch, make_batch


@torch.no_grad()
def _target_pass(model: GlideForCausalLM, target, batch: Batch):
    """Frozen target forward: (the ``N_D`` (k, v) pairs the draft reads, greedy predictions ``[B, T]``)."""
    was_training = target.training
    target.eval()
    out = target(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=True)
    target.train(was_training)
    kv = [(k.detach(), v.detach()) for k, v in model.target_kv(out.past_key_values)]
    t = batch.input_ids.shape[1]
    for k, _ in kv:
        if k.shape[-2] != t:
            raise ValueError(f"target cache layer holds {k.shape[-2]} positions for {t} tokens (a sliding-window "
                             "layer?): GLIDE training needs full-attention target layers (set target_layer_ids).")
    return kv, out.logits.argmax(-1)


def _draft_logits(model: GlideForCausalLM, batch: Batch, kv, block: int, first_block: str) -> torch.Tensor:
    t = batch.input_ids.shape[1]
    mask = glide_cross_mask(t, t, block, first_block).to(batch.input_ids.device)          # [T, T]
    return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, target_key_values=kv,
                 cross_attention_mask=mask, full_vocab=False).logits                       # [B, T, N]


def glide_loss(model: GlideForCausalLM, target, batch: Batch, block: int | None = None,
               first_block: str = "none") -> tuple[torch.Tensor, dict]:
    """Weighted next-token cross-entropy of the GLIDE draft ``model`` reading ``target``'s KV cache through the
    block-wise mask (``block`` defaults to ``model.config.block_size``; ``first_block="causal"`` reproduces the
    authors' code, where block 0 sees the target causally). Returns ``(loss, {"top1": ...})``, ``top1`` = the
    weighted agreement of the draft's argmax with the batch tokens."""
    block = block or model.config.block_size
    kv, _ = _target_pass(model, target, batch)
    logits = _draft_logits(model, batch, kv, block, first_block)                          # [B, T, N]
    n = logits.shape[-1]
    labels = model.to_draft_ids(batch.input_ids[:, 1:]).to(logits.device)                 # [B, T-1]
    w = batch.weights[:, 1:].to(logits.device) * (labels < n)
    ce = F.cross_entropy(logits[:, :-1].float().reshape(-1, n), labels.reshape(-1).clamp_max(n - 1),
                         reduction="none").view_as(w)
    loss = (ce * w).sum() / w.sum().clamp_min(1.0)
    with torch.no_grad():
        hit = (logits[:, :-1].argmax(-1) == labels).float()
        top1 = float((hit * w).sum() / w.sum().clamp_min(1.0))
    return loss, {"top1": top1}


@torch.no_grad()
def glide_acceptance(model: GlideForCausalLM, target, data, index: list[int] | None = None, batch_size: int = 8,
                     max_len: int = 512, block: int | None = None) -> dict:
    """Teacher-forced greedy acceptance of the GLIDE draft against the target's greedy predictions.

    ``data``: a :class:`Batch`, an iterable of them, or a DistillStore with ``index`` (its held-out records;
    prompt positions then weigh 0). Counted positions: those with ``weights > 0``.

    ``alpha``: fraction of counted positions where the draft's argmax (block-wise mask) equals the target's
    greedy token; ``tau@L``: mean number of tokens accepted from an ``L``-token draft started at a block start
    (``L`` = ``block``), ``drafts``: how many such drafts were scored."""
    block = block or model.config.block_size
    if isinstance(data, Batch):
        batches: Iterable[Batch] = [data]
    elif index is not None:
        batches = (make_batch(data, index[s : s + batch_size], max_len, prompt_weight=0.0)
                   for s in range(0, len(index), batch_size))
    else:
        batches = data
    hits, counted, runs = [], 0, []
    was_training = model.training
    model.eval()
    for b in batches:
        kv, pred = _target_pass(model, target, b)                                         # pred [B, T]
        logits = _draft_logits(model, b, kv, block, "none")                               # [B, T, N]
        draft = model.vocab_subset[logits.argmax(-1)] if not model.config.share_target_embeddings else logits.argmax(-1)
        ok = (draft[:, :-1] == pred[:, :-1].to(draft.device)).cpu().numpy()               # position t predicts t + 1
        use = (b.weights[:, 1:] > 0).cpu().numpy()
        for r in range(ok.shape[0]):
            hits.append(ok[r][use[r]])
            counted += int(use[r].sum())
            for p in range(0, ok.shape[1], block):                                       # drafts from block starts
                if use[r, p]:
                    seg = ok[r, p : p + block] & use[r, p : p + block]
                    runs.append(int(np.argmin(np.append(seg, False))))
    model.train(was_training)
    flat = np.concatenate(hits) if hits else np.zeros(0, dtype=bool)
    return {"alpha": float(flat.mean()) if flat.size else 0.0, "eval_tokens": counted,
            f"tau@{block}": float(np.mean(runs)) if runs else 0.0, "drafts": len(runs)}
