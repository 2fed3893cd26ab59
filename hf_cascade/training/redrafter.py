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

import numpy as np
import torch
import torch.nn.functional as F

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
    e = emb_layer(ids)                                                                   # [B, T, H]
    if store is not None and store.hidden_size:
        hidden = store.hidden()
        b, t = batch.input_ids.shape
        x = torch.zeros(b, t, store.hidden_size)
        for row, i in enumerate(batch.index):
            r = store.records[i]
            n = min(t, r.length)
            x[row, :n] = torch.from_numpy(np.asarray(hidden[r.offset : r.offset + n], dtype=np.float32))
    else:
        out = target(input_ids=ids, attention_mask=batch.attention_mask.to(ids.device), output_hidden_states=True,
                     logits_to_keep=1)
        x = out.hidden_states[-1]                                                        # [B, T, H] (post final norm)
    return x.to(device=device, dtype=dtype), e.to(device=device, dtype=dtype)


def _draft_steps(head, x: torch.Tensor, e: torch.Tensor, L: int):
    """Yield ``(k, logits_k)`` for ``k = 1 .. L``: ``logits_k`` ``[B, T-k-1, N]`` at positions
    ``t = 0 .. T-k-2``, predicting token ``t+k+1`` teacher-forced on ``e_{t+1} .. e_{t+k}``."""
    t = x.shape[1]
    state = head.init_state(x[:, : t - 1])                                               # [B, T-1, H]
    for k in range(1, L + 1):
        n = t - k - 1                                                                    # positions with a label
        if n <= 0:
            break
        state = head.step(state[:, :n], e[:, k : k + n])                                 # s_k, [B, n, H]
        yield k, head.logits(state, x[:, :n], full_vocab=False)                          # [B, n, N]


def redrafter_loss(head, target, batch: Batch, L: int = 5, store: DistillStore | None = None) -> tuple[torch.Tensor, dict]:
    """The ReDrafter training loss for one batch (see the module docstring) and per-step metrics
    (``loss@k``, teacher-forced top-1 accuracy ``acc@k``). For :func:`hf_cascade.training.loop.train`:
    ``loss_fn = lambda m, b: redrafter_loss(m, target, b, L, store)``."""
    x, e = target_context(head, target, batch, store)
    ids = batch.input_ids.to(x.device)
    weights = batch.weights.to(device=x.device, dtype=torch.float32)
    n_cols = head.draft_vocab_size
    total = x.new_zeros((), dtype=torch.float32)
    metrics: dict[str, float] = {}
    for k, logits in _draft_steps(head, x, e, L):
        n = logits.shape[1]
        labels = head.to_draft_ids(ids[:, k + 1 : k + 1 + n])                             # [B, n] columns, N = outside
        w = weights[:, k + 1 : k + 1 + n] * (labels < n_cols)
        ce = F.cross_entropy(logits.float().reshape(-1, n_cols), labels.clamp_max(n_cols - 1).reshape(-1),
                             reduction="none").view_as(w)
        loss_k = (ce * w).sum() / w.sum().clamp_min(1e-8)
        total = total + loss_k
        with torch.no_grad():
            hit = (logits.argmax(-1) == labels).float()
            metrics[f"loss@{k}"] = float(loss_k.detach())
            metrics[f"acc@{k}"] = float((hit * w).sum() / w.sum().clamp_min(1e-8))
    return total, metrics


@torch.no_grad()
def redrafter_acceptance(head, target, store: DistillStore, index: list[int], L: int = 5, batch_size: int = 8,
                         max_len: int = 512, use_store_hidden: bool = True) -> dict:
    """Teacher-forced greedy acceptance of the first ``L`` draft positions on held-out records.

    At every position ``t`` whose next token is a response token and that has ``L`` more tokens
    after it, the head drafts greedily (beam width 1) after the target's own token ``t+1``; the
    target's greedy continuation is the stored one, so the draft's accepted length is the number of
    leading steps whose argmax equals the stored token (teacher forcing is exact up to the first
    miss). Returns ``tau`` (mean accepted draft tokens per target call, ``<= L``; a target call
    yields ``1 + tau`` tokens), ``alpha = tau / L``, ``accept@k`` (fraction of drafts with at least
    ``k`` tokens accepted) and ``eval_positions``."""
    runs: list[np.ndarray] = []
    for s in range(0, len(index), batch_size):
        b = make_batch(store, index[s : s + batch_size], max_len, prompt_weight=0.0)
        x, e = target_context(head, target, b, store if use_store_hidden else None)
        ids = b.input_ids.to(x.device)
        t = ids.shape[1]
        n = t - L - 1                                                                    # positions with L labels
        if n <= 0:
            continue
        hits = []
        for k, logits in _draft_steps(head, x, e, L):
            pred = head.to_target_ids(logits[:, :n].argmax(-1))                          # [B, n] target ids
            hits.append(pred == ids[:, k + 1 : k + 1 + n].to(pred.device))
        hit = torch.stack(hits, dim=-1).cpu()                                            # [B, n, L]
        run = hit.long().cumprod(-1).sum(-1)                                             # [B, n] accepted length
        valid = (b.weights[:, 1 : 1 + n] > 0) & b.attention_mask[:, L + 1 : L + 1 + n].bool()
        runs.append(run[valid].numpy())
    flat = np.concatenate(runs) if runs else np.zeros(0, dtype=np.int64)
    tau = float(flat.mean()) if flat.size else 0.0
    out = {"alpha": tau / L, "tau": tau, "eval_positions": int(flat.size)}
    for k in range(1, L + 1):
        out[f"accept@{k}"] = float((flat >= k).mean()) if flat.size else 0.0
    return out


__all__ = ["redrafter_acceptance", "redrafter_loss", "target_context"]
