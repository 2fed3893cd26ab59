"""Statistics shared by the sampling tests: exact processed distributions and chi-square limits."""

from __future__ import annotations

import math

import torch


def chi2_isf(df: int, z: float = 3.719) -> float:
    """Upper quantile of chi-square(df) (Wilson-Hilferty); z = 3.719 is the 1e-4 normal quantile."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def processed_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None) -> torch.Tensor:
    """``[..., V]`` logits -> the target's processed sampling distributions (float32)."""
    logits = logits.float() / temperature
    if top_k is not None:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    return logits.softmax(dim=-1)
