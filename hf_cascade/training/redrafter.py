"""Training loss and held-out metric of the ReDrafter head (:class:`~hf_cascade.heads.ReDrafterModel`).

Cheng et al. (2024), "Recurrent Drafter for Fast Speculative Decoding in Large Language Models";
the loss follows the reference trainer (``apple/ml-recurrent-drafter``, ``train/model.py`` and
``train/loss.py``): the target is frozen; at every position ``t`` its last hidden state ``x_t``
(which the target itself turns into token ``t+1``) is the head's context, and the recurrence is
teacher-forced on the true tokens::

    s_0 = 0,   s_k = f(U s_{k-1} + W e_{t+k} + b)   (k = 1 .. L)
    step k predicts token t+k+1 from [x_t, s_k]

so ``L`` recurrent steps predict tokens ``t+2 .. t+L+1`` (the ``L`` draft tokens that follow the
target's own token ``t+1`` in a beam of length ``L+1``). The loss is the SUM over ``k`` of the
cross-entropy of step ``k`` averaged over positions, every step weighted equally (the reference's
``drafter_loss``); positions are weighted by the batch's weight of the predicted token (prompt
tokens down-weighted, padding 0), which reduces to the reference's ``-100`` masking for 0/1 weights.
With a reduced vocabulary (``draft_vocab_size``), tokens outside the subset are ignored.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .acceptance import accept_by_position, runs_from_hits
from .features import FeatureRegression, stored_hidden
from .loop import Batch, make_batch
from .store import DistillStore


@torch.no_grad()
def target_context(head, target, batch: Batch, store: DistillStore | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, e)``, both ``[B, T, H]`` in the head's dtype and device: the frozen target's last hidden
    state (read from ``store.hidden()`` via ``batch.index`` when the store has hidden states, else
    computed) and its input embeddings of ``batch.input_ids``."""
    device, dtype = head.device, head.dtype
    emb_layer = target.get_input_embeddings()
    ids = batch.input_ids.to(emb_layer.weight.device)
    e = emb_layer(ids)  # [B, T, H]
    if store is not None and store.hidden_size:
        x = stored_hidden(store, batch)
    else:
        out = target(
            input_ids=ids,
            attention_mask=batch.attention_mask.to(ids.device),
            output_hidden_states=True,
            logits_to_keep=1,
        )
        x = out.hidden_states[-1]  # [B, T, H] (post final norm)
    return x.to(device=device, dtype=dtype), e.to(device=device, dtype=dtype)


def _draft_steps(head, x: torch.Tensor, e: torch.Tensor, L: int, embed=None):
    """Yield ``(k, logits_k, s_k)`` for ``k = 1 .. L``: ``logits_k`` ``[B, T-k-1, N]`` at positions
    ``t = 0 .. T-k-2``, predicting token ``t+k+1`` teacher-forced on ``e_{t+1} .. e_{t+k}``, and the state ``s_k``
    ``[B, T-k-1, H]`` it reads. With ``embed`` (the target's input embeddings), steps ``k >= 2`` are fed the
    embedding of the head's own argmax at step ``k-1`` instead (as a beam of width 1 in decoding)."""
    t = x.shape[1]
    state = head.init_state(x[:, : t - 1])  # [B, T-1, H]
    logits = None
    for k in range(1, L + 1):
        n = t - k - 1  # positions with a label
        if n <= 0:
            break
        fed = e[:, k : k + n]  # [B, n, H]
        if embed is not None and logits is not None:
            with torch.no_grad():
                own = head.to_target_ids(logits[:, :n].argmax(-1))  # step k-1's draft tokens
                fed = embed(own.to(embed.weight.device)).to(device=x.device, dtype=x.dtype)
        state = head.step(state[:, :n], fed)  # s_k, [B, n, H]
        logits = head.logits(state, x[:, :n], full_vocab=False)
        yield k, logits, state  # [B, n, N], [B, n, H]


def _step_loss(logits: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, head, k: int):
    """Weighted cross-entropy of step ``k``'s ``logits`` ``[B, n, N]`` against tokens ``t+k+1``, its weights and
    hits."""
    n, n_cols = logits.shape[1], head.draft_vocab_size
    labels = head.to_draft_ids(ids[:, k + 1 : k + 1 + n])  # [B, n] columns, N = outside
    w = weights[:, k + 1 : k + 1 + n] * (labels < n_cols)
    ce = F.cross_entropy(
        logits.float().reshape(-1, n_cols), labels.clamp_max(n_cols - 1).reshape(-1), reduction="none"
    ).view_as(w)
    loss = (ce * w).sum() / w.sum().clamp_min(1e-8)
    with torch.no_grad():
        acc = float(((logits.argmax(-1) == labels).float() * w).sum() / w.sum().clamp_min(1e-8))
    return loss, w, acc


def redrafter_loss(
    head,
    target,
    batch: Batch,
    L: int = 5,
    store: DistillStore | None = None,
    unroll: int = 1,
    features: FeatureRegression | None = None,
) -> tuple[torch.Tensor, dict]:
    """The ReDrafter training loss for one batch (see the module docstring) and per-step metrics
    (``loss@k``, teacher-forced top-1 accuracy ``acc@k``). For :func:`hf_cascade.training.loop.train`:
    ``loss_fn = lambda m, b: redrafter_loss(m, target, b, L, store)``.

    ``unroll = j > 1`` (training-time test, HASS / EAGLE-3): a second recurrence feeds steps ``2 .. j`` the embedding
    of the head's own argmax at the step before (as beam search does) instead of the true token's; its cross-entropy
    at those steps is added (``own@k``). ``features`` (EAGLE's feature loss, :class:`~.features.FeatureRegression`):
    plus the regression of the teacher-forced state ``s_k`` onto the target's last hidden state at ``t+k``, the
    state the target turns into token ``t+k+1``, the token step ``k`` predicts (``store`` must hold hidden states)."""
    x, e = target_context(head, target, batch, store)
    ids = batch.input_ids.to(x.device)
    weights = batch.weights.to(device=x.device, dtype=torch.float32)
    total = x.new_zeros((), dtype=torch.float32)
    metrics: dict[str, float] = {}
    for k, logits, state in _draft_steps(head, x, e, L):
        loss_k, w, acc = _step_loss(logits, ids, weights, head, k)
        total = total + loss_k
        metrics[f"loss@{k}"], metrics[f"acc@{k}"] = float(loss_k.detach()), acc
        if features is not None:
            n = logits.shape[1]
            feature_loss = features(state, x[:, k : k + n], w)
            total = total + feature_loss
            metrics[f"feature@{k}"] = float(feature_loss.detach())
    if unroll > 1:
        for k, logits, _ in _draft_steps(head, x, e, min(unroll, L), embed=target.get_input_embeddings()):
            if k > 1:
                loss_k, _, _ = _step_loss(logits, ids, weights, head, k)
                total = total + loss_k
                metrics[f"own@{k}"] = float(loss_k.detach())
    return total, metrics


@torch.no_grad()
def redrafter_acceptance(
    head,
    target,
    store: DistillStore,
    index: list[int],
    L: int = 5,
    batch_size: int = 8,
    max_len: int = 512,
    use_store_hidden: bool = True,
    labels_fn: Callable[[Batch], torch.Tensor] | None = None,
) -> dict:
    """Teacher-forced greedy acceptance of the first ``L`` draft positions on held-out records.

    At every position ``t`` whose next token is a response token and that has ``L`` more tokens
    after it, the head drafts greedily (beam width 1) after the target's own token ``t+1``; the
    target's greedy continuation is the stored one (or ``labels_fn(batch)``'s ``[B, T]``, column ``t`` the target's
    greedy token after ``t``: :class:`~.acceptance.GreedyLabels` for a teacher-forced store), so the draft's accepted
    length is the number of leading steps whose argmax equals it (teacher forcing is exact up to the first
    miss). Returns ``tau`` (mean accepted draft tokens per target call, ``<= L``; a target call
    yields ``1 + tau`` tokens), ``alpha = tau / L``, ``accept@k`` (fraction of drafts with at least
    ``k`` tokens accepted, :func:`~.acceptance.accept_by_position`) and ``eval_positions``."""
    runs: list[np.ndarray] = []
    for s in range(0, len(index), batch_size):
        b = make_batch(store, index[s : s + batch_size], max_len, prompt_weight=0.0)
        x, e = target_context(head, target, b, store if use_store_hidden else None)
        ids = b.input_ids.to(x.device)
        labels = labels_fn(b).to(x.device) if labels_fn is not None else ids[:, 1:]  # column t: token after t
        t = ids.shape[1]
        n = t - L - 1  # positions with L labels
        if n <= 0:
            continue
        hits = []
        for k, logits, _ in _draft_steps(head, x, e, L):
            pred = head.to_target_ids(logits[:, :n].argmax(-1))  # [B, n] target ids
            hits.append(pred == labels[:, k : k + n].to(pred.device))
        run = runs_from_hits(torch.stack(hits, dim=-1).cpu())  # [B, n] accepted length
        valid = (b.weights[:, 1 : 1 + n] > 0) & b.attention_mask[:, L + 1 : L + 1 + n].bool()
        runs.append(run[valid].numpy())
    by_position = accept_by_position(np.concatenate(runs) if runs else [], L)
    return {"alpha": by_position["tau"] / L, "eval_positions": int(sum(r.size for r in runs)), **by_position}


__all__ = ["redrafter_acceptance", "redrafter_loss", "target_context"]
