"""Feature regression beside the token loss (EAGLE, Li et al., 2024, Section 4: smooth-L1 between the head's predicted
feature and the target's, next to the cross-entropy of its tokens; HASS and EAGLE-3 keep a token loss beside it).

A drafter head's feature (GLIDE's last hidden state, ReDrafter's recurrent state) lives in its own width; a linear map
(:class:`FeatureRegression`, trained with the head, never saved with it) takes it to the target's, and the loss is
the smooth-L1 distance to the target's last hidden state at the position whose next token the head predicts, read
from a store distilled with hidden states (:func:`stored_hidden`). The loop optimises a loss's own parameters beside
the head's when the loss is a module (:class:`HeadLoss`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .batches import Batch


def require_hidden(store) -> None:
    """``ValueError`` unless ``store`` holds the target's hidden states (what a feature loss regresses onto)."""
    if not store.hidden_size:
        raise ValueError(
            f"{getattr(store, 'path', 'the store')} holds no hidden states: distill with --hidden-states "
            "or --teacher-forced for a feature loss"
        )


def stored_hidden(store, batch: Batch) -> torch.Tensor:
    """The target's last hidden states ``[B, T, H]`` (float32, zeros past a record's end) of ``batch``'s records, read
    from ``store.hidden()`` through ``batch.index``."""
    require_hidden(store)
    hidden = store.hidden()
    b, t = batch.input_ids.shape
    x = torch.zeros(b, t, store.hidden_size)
    for row, i in enumerate(batch.index):
        r = store.records[i]
        n = min(t, r.length)
        x[row, :n] = torch.from_numpy(np.asarray(hidden[r.offset : r.offset + n], dtype=np.float32))
    return x


class FeatureRegression(torch.nn.Module):
    """``weight`` x the weighted mean over positions of ``smooth_l1(proj(feature), target_feature)`` (mean over the
    target's width; ``beta`` the smooth-L1 threshold): ``proj`` a bias-free linear map from the head's width ``dim``
    to the target's ``target_dim``."""

    def __init__(self, dim: int, target_dim: int, weight: float = 1.0, beta: float = 1.0):
        super().__init__()
        if weight <= 0:
            raise ValueError(f"a feature loss needs a positive weight, got {weight}")
        self.proj = torch.nn.Linear(dim, target_dim, bias=False)
        self.weight, self.beta = float(weight), float(beta)

    def forward(self, feature: torch.Tensor, target_feature: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``feature`` ``[..., D]``, ``target_feature`` ``[..., H]``, ``w`` ``[...]`` position weights."""
        pred = self.proj(feature.to(self.proj.weight.dtype)).float()
        d = F.smooth_l1_loss(pred, target_feature.to(pred.device).float(), beta=self.beta, reduction="none").mean(-1)
        w = w.to(d.device)
        return self.weight * (d * w).sum() / w.sum().clamp_min(1e-8)


class HeadLoss(torch.nn.Module):
    """A head's loss function ``fn(model, batch, **parts)`` with the training-only modules it owns (``parts``, e.g. a
    :class:`FeatureRegression`): as a module, the loop trains their parameters with the head's and synchronises them
    over processes; the head's checkpoint never holds them."""

    def __init__(self, fn: Callable, **parts: torch.nn.Module):
        super().__init__()
        self.fn = fn
        self.parts = torch.nn.ModuleDict(parts)

    def forward(self, model, batch):
        return self.fn(model, batch, **self.parts)


__all__ = ["FeatureRegression", "HeadLoss", "require_hidden", "stored_hidden"]
