"""Held-out acceptance by drafted position: the metric by which a head's training recipe is compared (issue 74).

A greedy draft of ``L`` tokens is accepted up to its first miss; its *run* is that accepted length. Over the held-out
drafts, ``accept@k`` is the share of drafts with at least ``k`` tokens accepted (``k = 1 .. L``, non-increasing) and
``tau`` their mean run, ``tau = accept@1 + ... + accept@L`` (a target call then yields ``1 + tau`` tokens). HASS and
EAGLE-3 report acceptance this way because a recipe that helps the first drafted token may not help the later ones.

What a draft must match is the target's greedy next token. A greedy distillation store holds exactly those tokens. A
teacher-forced store (``distill --teacher-forced``) holds a text, with the target's last hidden state at every
position: the target's greedy token after position ``t`` is then the argmax of its LM head over that state
(:class:`GreedyLabels`), and the draft, fed the text, is scored against it. Where the text leaves the target's greedy
path the drafted context is the text's, not the draft's own: an approximation there, exact on greedy stores.
"""

from __future__ import annotations

import numpy as np
import torch

from .store import DistillStore


def accept_by_position(runs, length: int) -> dict:
    """``{"tau", "accept@1" .. "accept@L"}`` of the accepted lengths ``runs`` (ints in ``[0, L]``) of ``L``-token
    drafts (all zeros when there are none)."""
    flat = np.asarray(runs, dtype=np.int64).reshape(-1)
    out = {"tau": float(flat.mean()) if flat.size else 0.0}
    for k in range(1, length + 1):
        out[f"accept@{k}"] = float((flat >= k).mean()) if flat.size else 0.0
    return out


def runs_from_hits(hits: torch.Tensor) -> torch.Tensor:
    """Accepted lengths ``[...]`` of drafts whose per-position agreements are ``hits`` ``[..., L]`` (bool): the number
    of leading ``True``."""
    return hits.long().cumprod(-1).sum(-1)


class GreedyLabels:
    """The target's greedy next token at every position of a store's records: the stored tokens of a greedy store;
    for a store with teacher-forced records (``meta["teacher_forced"]``, with hidden states), the argmax of the
    target's LM head over the stored last hidden state (computed once per record, in chunks of ``chunk`` positions).

    ``labels(batch)``: ``[B, T]`` long, column ``t`` the target's greedy token after position ``t`` of the batch's
    tokens (the last column of a record: its next stored token, or the computed one; unused by the metrics)."""

    def __init__(self, store: DistillStore, target=None, chunk: int = 256):
        self.store, self.chunk = store, int(chunk)
        forced = store.meta.get("teacher_forced")  # a list when the shards of a mixed store differ
        self.computed = bool(any(forced) if isinstance(forced, list) else forced) and bool(store.hidden_size)
        if self.computed and target is None:
            raise ValueError("a teacher-forced store's greedy labels need the target's LM head")
        self.head = target.get_output_embeddings() if self.computed else None
        self.records: dict[int, torch.Tensor] = {}

    @torch.no_grad()
    def _record(self, i: int) -> torch.Tensor:
        if i not in self.records:
            r = self.store.records[i]
            hidden = self.store.hidden()[r.offset : r.offset + r.length]
            w = self.head.weight
            out = []
            for s in range(0, r.length, self.chunk):
                x = torch.from_numpy(np.asarray(hidden[s : s + self.chunk], dtype=np.float32)).to(w.device, w.dtype)
                out.append(self.head(x).argmax(-1).cpu())
            self.records[i] = torch.cat(out)
        return self.records[i]

    def __call__(self, batch) -> torch.Tensor:
        ids = batch.input_ids
        labels = torch.zeros_like(ids)
        labels[:, :-1] = ids[:, 1:]
        if self.computed:
            t = ids.shape[1]
            for row, i in enumerate(batch.index):
                g = self._record(i)[:t]
                labels[row, : g.numel()] = g.to(labels.device)
        return labels


def plot_acceptance(curves: dict[str, dict], path, title: str = "held-out acceptance by drafted position") -> bool:
    """One line per entry of ``curves`` (``name -> {"accept@k": ...}``): acceptance against the drafted position,
    saved as a PNG at ``path``. ``False`` (nothing written) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for name, ev in curves.items():
        ks = sorted(int(k.split("@")[1]) for k in ev if k.startswith("accept@"))
        if ks:
            tau = f" (tau {ev['tau']:.2f})" if "tau" in ev else ""
            ax.plot(ks, [ev[f"accept@{k}"] for k in ks], "o-", label=f"{name}{tau}")
    ax.set_xlabel("drafted position k")
    ax.set_ylabel("accept@k (share of drafts with >= k accepted)")
    ax.set_ylim(0, 1)
    ax.set_xticks(range(1, 1 + max((sum(k.startswith("accept@") for k in ev) for ev in curves.values()), default=1)))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


__all__ = ["GreedyLabels", "accept_by_position", "plot_acceptance", "runs_from_hits"]
