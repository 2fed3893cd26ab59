"""GLIDE training (Du et al., ICML 2024, "GLIDE with a CAPE", Section 4.1 and Appendix B).

The target is frozen: one forward without gradients (``use_cache=True``, ``logits_to_keep=1``: the
``[B, T, V]`` logits are never computed) over the batch yields its KV cache, from which each draft layer
``m`` reads layer ``l = N_T - N_D + m`` (:func:`target_kv_batch`; :class:`TargetKVMemo` keeps it per record
across epochs). The draft then runs over the same tokens with the block-wise cross-attention mask
(:func:`~hf_cascade.heads.glide.modeling_glide.glide_cross_mask`, blocks of ``L = 5``): a position in block
``b`` sees only the target's K/V of blocks ``< b``, as at decoding time after ``b * L`` verified tokens. Loss:
next-token cross-entropy on the batch tokens (the target's greedy responses in a distillation store),
weighted by ``batch.weights``; tokens outside a reduced draft vocabulary are ignored.

Greedy acceptance with teacher forcing (:func:`glide_acceptance`): with that mask, a draft of ``L`` tokens
started at a block start ``p`` sees exactly what it would see in decoding after the target verified ``p``
tokens, so the run of consecutive agreements with the target's greedy tokens (the store's responses) from
``p`` is the number of tokens such a draft gets accepted.
"""

from __future__ import annotations

import inspect
from typing import Callable, Iterable

import numpy as np
import torch
import torch.nn.functional as F

from ..compat import output_cache
from ..heads.glide import GlideForCausalLM, glide_cross_mask
from .loop import Batch, make_batch


@torch.no_grad()
def target_kv_batch(model: GlideForCausalLM, target, batch: Batch) -> list | None:
    """Frozen target forward over ``batch`` (``logits_to_keep=1``: only its KV cache is needed, never the
    ``[B, T, V]`` logits): the ``N_D`` pairs ``(k, v)``, each ``[B, kv_heads, T, d_k]``, that the draft
    layers read. ``None`` (no target forward) for a GLIDE without cross-attention."""
    if not model.config.cross_attention:
        return None
    was_training = target.training
    target.eval()
    kwargs = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(target.forward).parameters else {}
    out = target(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=True, **kwargs)
    target.train(was_training)
    dev = model.device                                           # a device-mapped target's layer may sit elsewhere
    kv = [(k.detach().to(dev), v.detach().to(dev)) for k, v in model.target_kv(output_cache(out))]
    t = batch.input_ids.shape[1]
    for k, _ in kv:
        if k.shape[-2] != t:
            raise ValueError(f"target cache layer holds {k.shape[-2]} positions for {t} tokens (a sliding-window "
                             "layer?): GLIDE training needs full-attention target layers (set target_layer_ids).")
    return kv


class TargetKVMemo:
    """The target K/V a GLIDE reads, per distillation record, computed once and reused by later epochs and
    evaluations (the frozen target's forward dominates a training step: it is many times the draft's forward and
    backward).

    ``memo(batch)`` returns the batch's ``N_D`` pairs ``(k, v)`` ``[B, kv_heads, T, d_k]`` (zeros at padding),
    running the target only on records not cached yet (or cached shorter than the batch needs: sequences are
    cut at the end, so a record's K/V prefix never changes). Records are cached in the target's dtype while
    the memo holds at most ``max_bytes``; beyond that they are recomputed each time. ``None`` for a GLIDE
    without cross-attention."""

    def __init__(self, model: GlideForCausalLM, target, max_bytes: int = 4 << 30):
        self.model, self.target, self.max_bytes = model, target, int(max_bytes)
        self.records: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}   # index -> N_D x ([kv, n, d] x 2)
        self.bytes = 0
        self.target_tokens = 0                                                    # tokens the target processed

    def __call__(self, batch: Batch) -> list | None:
        if not self.model.config.cross_attention:
            return None
        lengths = batch.attention_mask.sum(-1).tolist()                             # right padding: valid prefix
        missing = [b for b, i in enumerate(batch.index) if i not in self.records or
                   self.records[i][0][0].shape[-2] < lengths[b]]
        fresh: dict[int, list] = {}
        if missing:
            rows = torch.tensor(missing)
            width = int(max(lengths[b] for b in missing))
            sub = Batch(batch.input_ids[rows, :width], batch.weights[rows, :width],
                        batch.attention_mask[rows, :width], [batch.index[b] for b in missing])
            kv = target_kv_batch(self.model, self.target, sub)
            self.target_tokens += int(sum(lengths[b] for b in missing))
            for r, b in enumerate(missing):
                pairs = [(k[r, :, : lengths[b]].clone(), v[r, :, : lengths[b]].clone()) for k, v in kv]
                fresh[b] = pairs
                size = sum(k.numel() * k.element_size() * 2 for k, _ in pairs)
                old = self.records.get(batch.index[b])
                old_size = sum(k.numel() * k.element_size() * 2 for k, _ in old) if old else 0
                if self.bytes - old_size + size <= self.max_bytes:
                    self.records[batch.index[b]] = pairs
                    self.bytes += size - old_size
        t = batch.input_ids.shape[1]
        out = []
        for m in range(self.model.config.num_hidden_layers):
            first = (fresh.get(0) or self.records[batch.index[0]])[m][0]
            shape = (len(batch.index), first.shape[0], t, first.shape[-1])
            k_all, v_all = first.new_zeros(shape), first.new_zeros(shape)
            for b, i in enumerate(batch.index):
                k, v = (fresh.get(b) or self.records[i])[m]
                n = min(lengths[b], t)
                k_all[b, :, :n], v_all[b, :, :n] = k[:, :n], v[:, :n]
            out.append((k_all, v_all))
        return out


def _draft_logits(model: GlideForCausalLM, batch: Batch, kv, block: int, first_block: str) -> torch.Tensor:
    t = batch.input_ids.shape[1]
    mask = glide_cross_mask(t, t, block, first_block).to(batch.input_ids.device)          # [T, T]
    return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, target_key_values=kv,
                 cross_attention_mask=mask, full_vocab=False).logits                       # [B, T, N]


def glide_loss(model: GlideForCausalLM, target, batch: Batch, block: int | None = None,
               first_block: str = "none", kv: list | None = None) -> tuple[torch.Tensor, dict]:
    """Weighted next-token cross-entropy of the GLIDE draft ``model`` reading ``target``'s KV cache through the
    block-wise mask (``block`` defaults to ``model.config.block_size``; ``first_block="causal"`` reproduces the
    authors' code, where block 0 sees the target causally). ``kv``: the target K/V for ``batch`` when already
    at hand (e.g. from a :class:`TargetKVMemo`), else computed by :func:`target_kv_batch`. Returns
    ``(loss, {"top1": ...})``, ``top1`` = the weighted agreement of the draft's argmax with the batch tokens."""
    block = block or model.config.block_size
    if kv is None:
        kv = target_kv_batch(model, target, batch)
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
                     max_len: int = 512, block: int | None = None,
                     kv_fn: Callable[[Batch], list | None] | None = None) -> dict:
    """Teacher-forced greedy acceptance of the GLIDE draft, against the stored tokens: the distillation store
    holds the target's own greedy responses, so the token after position ``t`` *is* the target's greedy
    prediction there and no target logits are needed (only its K/V, from ``kv_fn``, default
    :func:`target_kv_batch`; a GLIDE without cross-attention needs no target forward at all).

    ``data``: a :class:`Batch`, an iterable of them, or a DistillStore with ``index`` (its held-out records;
    prompt positions then weigh 0). Counted positions: those whose next token has ``weights > 0`` (with a
    hand-made Batch, its tokens there must be the target's greedy ones).

    ``alpha``: fraction of counted positions where the draft's argmax (block-wise mask) equals the next token;
    ``tau@L``: mean number of tokens accepted from an ``L``-token draft started at a block start (``L`` =
    ``block``), ``drafts``: how many such drafts were scored. The same metric serves the paper's controlled
    comparison (Figure 4): GLIDE against the same architecture with ``cross_attention=False``."""
    block = block or model.config.block_size
    kv_fn = kv_fn or (lambda b: target_kv_batch(model, target, b))
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
        logits = _draft_logits(model, b, kv_fn(b), block, "none")                          # [B, T, N]
        draft = model.vocab_subset[logits.argmax(-1)] if not model.config.share_target_embeddings else logits.argmax(-1)
        ok = (draft[:, :-1] == b.input_ids[:, 1:].to(draft.device)).cpu().numpy()         # position t predicts t + 1
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


__all__ = ["TargetKVMemo", "glide_acceptance", "glide_loss", "target_kv_batch"]
