"""Teacher-forced soft labels for the vanilla drafter: the target's top-K next-token log-probabilities
over the drafter's reduced vocabulary, at every position of a distillation store.

Sequence-level distillation (Kim & Rush, 2016), what ``hf-cascade distill`` stores, gives the drafter
one label per position: the target's greedy token. DistillSpec (Zhou et al., 2024, "DistillSpec:
Improving Speculative Decoding via Knowledge Distillation", cited by the CS Drafting and GLIDE papers)
distils the target's whole next-token distribution instead. Here the two are combined: the stored
greedy responses (on-policy for a greedy target) with, at every position, the target's distribution
computed by one teacher-forced forward. The distribution is also a valid label at *prompt* positions
(human text the target did not write, whose hard labels are down-weighted), so the same store yields
more supervision. Deviation from DistillSpec: the labels are the top ``K`` of the distribution over
the drafter's ``N``-token subset, renormalised (a [num_tokens, K] memory-mapped table instead of full
rows), and the drafter's own samples are not used (its on-policy data would need a drafter in the loop).

A store directory gets one sub-directory per (subset, K)::

    soft-<N>-top<K>-<hash>/ids.npy    int16/int32 [num_tokens, K] draft ids of the top-K tokens
    soft-<N>-top<K>-<hash>/logp.npy   float16     [num_tokens, K] their log-probs (over the subset)
    soft-<N>-top<K>-<hash>/done.json  written last: what the tables cover

Row ``j`` holds the target's prediction of token ``j + 1`` of the same record.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from .store import DistillStore


@dataclass(frozen=True)
class SoftLabels:
    """The top-K table of one store for one draft vocabulary (see the module docstring)."""

    subset: torch.Tensor  # [N] target ids, sorted
    ids: np.ndarray  # [num_tokens, K] draft ids in [0, N)
    logp: np.ndarray  # [num_tokens, K] log-probs over the subset

    @property
    def top_k(self) -> int:
        return int(self.ids.shape[1])

    def rows(self, store: DistillStore, index: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids [B, width, K] long, logp [B, width, K] float)`` for records ``index``, laid out like
        :func:`~hf_cascade.training.loop.make_batch` (right-padded; padding rows: id 0, log-prob -inf
        except column 0, so a renormalised padding row is a valid one-hot that the loss weights out)."""
        k = self.top_k
        ids = torch.zeros(len(index), width, k, dtype=torch.long)
        logp = torch.full((len(index), width, k), -float("inf"))
        logp[..., 0] = 0.0
        for b, i in enumerate(index):
            r = store.records[i]
            n = min(width, r.length)
            ids[b, :n] = torch.from_numpy(self.ids[r.offset : r.offset + n].astype(np.int64))
            logp[b, :n] = torch.from_numpy(self.logp[r.offset : r.offset + n].astype(np.float32))
        return ids, logp


def soft_label_dir(store: DistillStore, subset: torch.Tensor, top_k: int) -> Path:
    """Where the table for ``subset`` and ``top_k`` lives (keyed by a hash of the subset)."""
    digest = hashlib.sha1(subset.numpy().astype(np.int64).tobytes()).hexdigest()[:10]
    return store.path / f"soft-{subset.numel()}-top{top_k}-{digest}"


def load_soft_labels(store: DistillStore, subset: torch.Tensor, top_k: int) -> SoftLabels | None:
    """The finished table for ``subset`` / ``top_k`` covering the whole store, or ``None``."""
    path = soft_label_dir(store, subset, top_k)
    done = path / "done.json"
    if not done.is_file() or json.loads(done.read_text()).get("num_tokens") != store.num_tokens:
        return None
    return SoftLabels(subset, np.load(path / "ids.npy", mmap_mode="r"), np.load(path / "logp.npy", mmap_mode="r"))


@torch.no_grad()
def compute_soft_labels(
    target, store: DistillStore, subset: torch.Tensor, top_k: int = 16, batch_size: int = 8, progress: bool = True
) -> SoftLabels:
    """Run the frozen ``target`` teacher-forced over every record of ``store`` (records of similar
    length batched together) and write the top-``top_k`` table; reuses a finished one.

    Only the ``N`` head rows of the subset are computed (``[T, H] @ [H, N]``), not the full head.
    Interrupted runs start over (the pass is a fraction of the distillation's cost)."""
    found = load_soft_labels(store, subset, top_k)
    if found is not None:
        return found
    n = subset.numel()
    if not 0 < top_k <= n:
        raise ValueError(f"top_k must be in [1, {n}], got {top_k}")
    path = soft_label_dir(store, subset, top_k)
    path.mkdir(parents=True, exist_ok=True)
    shape = (store.num_tokens, top_k)
    ids_out = np.lib.format.open_memmap(
        path / "ids.npy", mode="w+", dtype=np.int16 if n <= 32767 else np.int32, shape=shape
    )
    logp_out = np.lib.format.open_memmap(path / "logp.npy", mode="w+", dtype=np.float16, shape=shape)
    device = next(target.parameters()).device
    head = target.get_output_embeddings().weight[subset.to(device)].float()  # [N, H]
    body = target.get_decoder()
    order = sorted(range(len(store)), key=lambda i: store.records[i].length)
    for s in tqdm(range(0, len(order), batch_size), desc="soft labels", unit="batch", disable=not progress):
        index = order[s : s + batch_size]
        seqs = [store.sequence(i)[0] for i in index]
        width = max(len(x) for x in seqs)
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        mask = torch.zeros(len(seqs), width, dtype=torch.long)
        for b, x in enumerate(seqs):
            ids[b, : len(x)] = torch.from_numpy(x.astype(np.int64))
            mask[b, : len(x)] = 1
        hidden = body(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state  # [B, T, H]
        logp = _softcap(target, hidden.float() @ head.T).log_softmax(dim=-1)  # [B, T, N]
        top, arg = logp.topk(top_k, dim=-1)  # [B, T, K]
        for b, i in enumerate(index):
            r = store.records[i]
            ids_out[r.offset : r.offset + r.length] = arg[b, : r.length].cpu().numpy()
            logp_out[r.offset : r.offset + r.length] = top[b, : r.length].cpu().numpy()
    ids_out.flush()
    logp_out.flush()
    (path / "done.json").write_text(
        json.dumps({"num_tokens": store.num_tokens, "top_k": top_k, "draft_vocab_size": n}) + "\n"
    )
    return load_soft_labels(store, subset, top_k)


def _softcap(target, logits: torch.Tensor) -> torch.Tensor:
    """The target's final logit soft-capping (Gemma 2), if it has one."""
    cap = getattr(target.config.get_text_config(), "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


def soft_cross_entropy(logits: torch.Tensor, ids: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the drafter against the renormalised top-K target distribution, per position.

    ``logits``: ``[B, T, N]`` drafter logits; ``ids`` / ``logp``: ``[B, T, K]`` from
    :meth:`SoftLabels.rows`. Returns ``[B, T]``: ``-sum_k p_k log q(ids_k)`` with ``p = softmax(logp)``
    (equal to KL(p || q) up to p's entropy, which does not depend on the drafter)."""
    logq = logits.float().log_softmax(dim=-1).gather(-1, ids)  # [B, T, K]
    p = logp.softmax(dim=-1)  # [B, T, K]
    return -(p * logq).sum(dim=-1)
