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
from collections.abc import Callable, Iterable

import numpy as np
import torch
import torch.nn.functional as F

from ..compat import output_cache
from ..heads.glide import GlideForCausalLM, glide_cross_mask
from .acceptance import accept_by_position
from .features import FeatureRegression, stored_hidden
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
    dev = model.device  # a device-mapped target's layer may sit elsewhere
    kv = [(k.detach().to(dev), v.detach().to(dev)) for k, v in model.target_kv(output_cache(out))]
    t = batch.input_ids.shape[1]
    for k, _ in kv:
        if k.shape[-2] != t:
            raise ValueError(
                f"target cache layer holds {k.shape[-2]} positions for {t} tokens (a sliding-window "
                "layer?): GLIDE training needs full-attention target layers (set target_layer_ids)."
            )
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
        self.records: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # index -> N_D x ([kv, n, d] x 2)
        self.bytes = 0
        self.target_tokens = 0  # tokens the target processed

    def __call__(self, batch: Batch) -> list | None:
        if not self.model.config.cross_attention:
            return None
        lengths = batch.attention_mask.sum(-1).tolist()  # right padding: valid prefix
        missing = [
            b
            for b, i in enumerate(batch.index)
            if i not in self.records or self.records[i][0][0].shape[-2] < lengths[b]
        ]
        fresh: dict[int, list] = {}
        if missing:
            rows = torch.tensor(missing)
            width = int(max(lengths[b] for b in missing))
            sub = Batch(
                batch.input_ids[rows, :width],
                batch.weights[rows, :width],
                batch.attention_mask[rows, :width],
                [batch.index[b] for b in missing],
            )
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


def _draft_logits(
    model: GlideForCausalLM, batch: Batch, kv, block: int, first_block: str, input_ids=None, hidden: bool = False
):
    """The draft's logits ``[B, T, N]`` over ``input_ids`` (default the batch's) with the block-wise mask, and with
    ``hidden`` its last layer's output ``[B, T, D]`` too (``(logits, hidden)``)."""
    ids = batch.input_ids if input_ids is None else input_ids
    t = ids.shape[1]
    mask = glide_cross_mask(t, t, block, first_block).to(ids.device)  # [T, T]
    out = model(
        input_ids=ids,
        attention_mask=batch.attention_mask,
        target_key_values=kv,
        cross_attention_mask=mask,
        full_vocab=False,
        output_hidden_states=hidden,
    )
    return (out.logits, out.hidden_states[-1]) if hidden else out.logits  # [B, T, N] (, [B, T, D])


def _weighted_ce(logits: torch.Tensor, labels: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    n = logits.shape[-1]
    ce = F.cross_entropy(logits.float().reshape(-1, n), labels.reshape(-1).clamp_max(n - 1), reduction="none").view_as(
        w
    )
    return (ce * w).sum() / w.sum().clamp_min(1.0)


def glide_loss(
    model: GlideForCausalLM,
    target,
    batch: Batch,
    block: int | None = None,
    first_block: str = "none",
    kv: list | None = None,
    unroll: int = 1,
    features: FeatureRegression | None = None,
    store=None,
) -> tuple[torch.Tensor, dict]:
    """Weighted next-token cross-entropy of the GLIDE draft ``model`` reading ``target``'s KV cache through the
    block-wise mask (``block`` defaults to ``model.config.block_size``; ``first_block="causal"`` reproduces the
    authors' code, where block 0 sees the target causally). ``kv``: the target K/V for ``batch`` when already
    at hand (e.g. from a :class:`TargetKVMemo`), else computed by :func:`target_kv_batch`. Returns
    ``(loss, {"top1": ...})``, ``top1`` = the weighted agreement of the draft's argmax with the batch tokens.

    ``unroll = k > 1`` (training-time test, HASS / EAGLE-3): a draft started at a block start feeds its own tokens
    from its second position on. Pass ``j = 2 .. k`` runs the draft over the batch and a copy (:class:`_Unrolled`) fed,
    at block offsets ``1 .. j-1``, the previous pass's argmax in place of the batch's tokens; by induction the copy's
    positions at offset ``j-1`` then see exactly what drafted position ``j`` sees in decoding (offsets below it repeat
    pass ``j-1``), and their cross-entropy against the batch's tokens is added to the loss (``loss@j``).

    ``features`` (EAGLE's feature loss, :class:`~.features.FeatureRegression`): plus its regression of the draft's last
    hidden state at position ``t`` onto the target's (``store``'s) at ``t``, the state the target turns into token
    ``t + 1``, weighted as the token loss."""
    block = block or model.config.block_size
    if kv is None:
        kv = target_kv_batch(model, target, batch)
    out = _draft_logits(model, batch, kv, block, first_block, hidden=features is not None)
    logits, hidden = out if features is not None else (out, None)  # [B, T, N]
    n = logits.shape[-1]
    labels = model.to_draft_ids(batch.input_ids[:, 1:]).to(logits.device)  # [B, T-1]
    w = batch.weights[:, 1:].to(logits.device) * (labels < n)
    loss = _weighted_ce(logits[:, :-1], labels, w)
    with torch.no_grad():
        hit = (logits[:, :-1].argmax(-1) == labels).float()
        metrics = {"top1": float((hit * w).sum() / w.sum().clamp_min(1.0))}
    if features is not None:
        x = stored_hidden(store, batch)[:, :-1]  # [B, T-1, H_target]
        feature_loss = features(hidden[:, :-1], x, w)
        loss = loss + feature_loss
        metrics["feature_loss"] = float(feature_loss.detach())
    if unroll > 1:
        ids = batch.input_ids.to(logits.device)
        unrolled = _Unrolled(ids, batch.attention_mask.to(logits.device), block, first_block)
        fed, prev = ids, logits
        for j in range(2, unroll + 1):
            with torch.no_grad():
                own = _to_target(model, prev.argmax(-1))  # [B, T] own next tokens
                use = (unrolled.offset[1:] >= 1) & (unrolled.offset[1:] <= j - 1)
                fed = torch.cat([fed[:, :1], torch.where(use, own[:, :-1], fed[:, 1:])], dim=1)
            prev = unrolled.logits(model, fed, kv)
            at = (unrolled.offset[:-1] == j - 1).to(w.dtype)
            loss_j = _weighted_ce(prev[:, :-1], labels, w * at)
            loss = loss + loss_j
            metrics[f"loss@{j}"] = float(loss_j.detach())
    return loss, metrics


class _Unrolled:
    """The draft's forward over the batch's tokens followed by a copy fed other tokens at the same positions (EAGLE-3's
    training-time test): a copied position ``i``, in the block starting at ``p``, sees the batch's tokens before ``p``
    and the copy's from ``p`` to ``i`` (what it sees in decoding, drafting from ``p``), the target's K/V through the
    block-wise mask of its position. :meth:`logits` returns the copy's ``[B, T, N]``."""

    def __init__(self, ids: torch.Tensor, attention_mask: torch.Tensor, block: int, first_block: str):
        b, t = ids.shape
        pos = torch.arange(t, device=ids.device)
        self.offset = pos % block  # [T] offset in its block
        start = (pos - self.offset)[:, None]
        causal = pos[None, :] <= pos[:, None]  # [T, T]
        copy_rows = torch.cat([pos[None, :] < start, (pos[None, :] >= start) & causal], dim=1)
        self.self_mask = torch.cat([torch.cat([causal, torch.zeros_like(causal)], dim=1), copy_rows])  # [2T, 2T]
        cross = glide_cross_mask(t, t, block, first_block).to(ids.device)
        self.cross_mask = torch.cat([cross, cross])  # [2T, T]
        self.position_ids = torch.cat([pos, pos])[None].expand(b, 2 * t)
        self.attention_mask = torch.cat([attention_mask, attention_mask], dim=1)
        self.ids, self.keep = ids, torch.arange(t, 2 * t, device=ids.device)

    def logits(self, model: GlideForCausalLM, fed: torch.Tensor, kv) -> torch.Tensor:
        return model(
            input_ids=torch.cat([self.ids, fed], dim=1),
            attention_mask=self.attention_mask,
            position_ids=self.position_ids,
            target_key_values=kv,
            cross_attention_mask=self.cross_mask,
            self_attention_mask=self.self_mask,
            full_vocab=False,
            logits_to_keep=self.keep,
        ).logits


def _to_target(model: GlideForCausalLM, draft_ids: torch.Tensor) -> torch.Tensor:
    """Target ids of the draft's output columns (the columns themselves with the target's shared embeddings)."""
    if model.config.share_target_embeddings:
        return draft_ids
    return model.vocab_subset.to(draft_ids.device)[draft_ids]


@torch.no_grad()
def glide_acceptance(
    model: GlideForCausalLM,
    target,
    data,
    index: list[int] | None = None,
    batch_size: int = 8,
    max_len: int = 512,
    block: int | None = None,
    kv_fn: Callable[[Batch], list | None] | None = None,
    labels_fn: Callable[[Batch], torch.Tensor] | None = None,
) -> dict:
    """Teacher-forced greedy acceptance of the GLIDE draft, against the target's greedy tokens: ``labels_fn(batch)``
    ``[B, T]``, column ``t`` the target's greedy token after position ``t`` (default: the batch's own next tokens, the
    target's greedy responses in a greedy distillation store; a teacher-forced store's come from
    :class:`~.acceptance.GreedyLabels`). No target logits are needed (only its K/V, from ``kv_fn``, default
    :func:`target_kv_batch`; a GLIDE without cross-attention needs no target forward at all).

    ``data``: a :class:`Batch`, an iterable of them, or a DistillStore with ``index`` (its held-out records;
    prompt positions then weigh 0). Counted positions: those whose next token has ``weights > 0``.

    ``alpha``: fraction of counted positions where the draft's argmax (block-wise mask) equals the label;
    drafts of ``L`` = ``block`` tokens start at block starts (with the mask, such a draft sees exactly what it sees in
    decoding after the target verified the tokens before it, and teacher forcing is exact up to its first miss):
    ``tau@L`` (= ``tau``) their mean accepted length, ``accept@k`` the share with at least ``k`` accepted
    (:func:`~.acceptance.accept_by_position`), ``drafts`` how many were scored. The same metric serves the paper's
    controlled comparison (Figure 4): GLIDE against the same architecture with ``cross_attention=False``."""
    block = block or model.config.block_size
    kv_fn = kv_fn or (lambda b: target_kv_batch(model, target, b))
    if isinstance(data, Batch):
        batches: Iterable[Batch] = [data]
    elif index is not None:
        batches = (
            make_batch(data, index[s : s + batch_size], max_len, prompt_weight=0.0)
            for s in range(0, len(index), batch_size)
        )
    else:
        batches = data
    hits, counted, runs = [], 0, []
    was_training = model.training
    model.eval()
    for b in batches:
        logits = _draft_logits(model, b, kv_fn(b), block, "none")  # [B, T, N]
        draft = _to_target(model, logits.argmax(-1))
        labels = labels_fn(b) if labels_fn is not None else b.input_ids[:, 1:]
        ok = (draft[:, :-1] == labels[:, : draft.shape[1] - 1].to(draft.device)).cpu().numpy()  # t predicts t + 1
        use = (b.weights[:, 1:] > 0).cpu().numpy()
        for r in range(ok.shape[0]):
            hits.append(ok[r][use[r]])
            counted += int(use[r].sum())
            for p in range(0, ok.shape[1], block):  # drafts from block starts
                if use[r, p]:
                    seg = ok[r, p : p + block] & use[r, p : p + block]
                    runs.append(int(np.argmin(np.append(seg, False))))
    model.train(was_training)
    flat = np.concatenate(hits) if hits else np.zeros(0, dtype=bool)
    by_position = accept_by_position(runs, block)
    return {
        "alpha": float(flat.mean()) if flat.size else 0.0,
        "eval_tokens": counted,
        f"tau@{block}": by_position["tau"],
        "drafts": len(runs),
        **by_position,
    }


__all__ = ["TargetKVMemo", "glide_acceptance", "glide_loss", "target_kv_batch"]
