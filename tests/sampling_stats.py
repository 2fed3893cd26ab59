"""Statistics shared by the sampling tests: exact processed distributions and chi-square limits."""

from __future__ import annotations

import math

import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor, TopPLogitsWarper


def chi2_isf(df: int, z: float = 3.719) -> float:
    """Upper quantile of chi-square(df) (Wilson-Hilferty); z = 3.719 is the 1e-4 normal quantile."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def processed_probs(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float | None = None,
    prefixes: list[list[int]] | None = None,
) -> torch.Tensor:
    """``[..., V]`` logits -> the target's processed sampling distributions (float32), in plain ``generate``'s
    order: the repetition penalty over each row's prefix (``prefixes``: one id list per row), then temperature,
    top-k, top-p (transformers' own processors for the penalty and top-p)."""
    logits = logits.float()
    if repetition_penalty is not None:
        rows = logits.reshape(-1, logits.shape[-1])
        assert prefixes is not None and len(prefixes) == rows.shape[0], "the penalty needs every row's prefix"
        penalty = RepetitionPenaltyLogitsProcessor(repetition_penalty)
        penalised = [
            penalty(torch.tensor([prefix], device=row.device), row[None].clone()) for prefix, row in zip(prefixes, rows)
        ]
        logits = torch.cat(penalised).view_as(logits)
    logits = logits / temperature
    if top_k is not None:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if top_p is not None:
        flat = logits.reshape(-1, logits.shape[-1])
        logits = TopPLogitsWarper(top_p)(None, flat).view_as(logits)
    return logits.softmax(dim=-1)


def pooled_chi2(observed: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """Chi-square of counts against expectations, the cells expected < 5 times pooled: ``(chi2, limit)``."""
    small = expected < 5
    o = torch.cat([observed[~small], observed[small].sum()[None]])
    e = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = e > 0
    chi2 = float(((o[keep] - e[keep]) ** 2 / e[keep]).sum())
    return chi2, chi2_isf(max(int(keep.sum()) - 1, 1))


def maxgram_guess(seq: list[int], t: int) -> int | None:
    """The token that followed the most recent earlier occurrence of ``seq[t - 1]`` (before ``t - 1``)."""
    last = seq[t - 1]
    for j in range(t - 2, -1, -1):
        if seq[j] == last:
            return seq[j + 1]
    return None


class _Indicator:
    """Observed and expected counts of "the emitted token is the guess": a z-score under the exact law."""

    def __init__(self):
        self.observed = self.expected = self.variance = 0.0

    def add(self, hit: bool, p: float) -> None:
        self.observed, self.expected, self.variance = (
            self.observed + hit,
            self.expected + p,
            self.variance + p * (1 - p),
        )

    @property
    def z(self) -> float:
        return (self.observed - self.expected) / math.sqrt(max(self.variance, 1e-9))


def calibration(
    model,
    drafter,
    sequences,
    prompt_len: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float | None = None,
) -> dict:
    """Emitted tokens against the target's exact processed distribution given the actual prefix.

    The token counts ``O_v`` and ``E_v = sum_t p_t(v)`` differ by a martingale, so the pooled chi-square is (at
    most) chi-square distributed; the indicators "``x_t`` is what Max-Gram would copy" and (with ``drafter``)
    "``x_t`` is the drafter's greedy token" give z-scores: a wrong ``q`` moves mass towards or away from the
    draft, which the token counts alone may miss. Sequences may live on any device; statistics on the host."""
    observed = expected = 0.0
    copy, draft = _Indicator(), _Indicator()
    for seq in sequences:
        with torch.no_grad():
            prefixes = [seq[:t].tolist() for t in range(prompt_len, len(seq))] if repetition_penalty else None
            p = processed_probs(
                model(seq[None]).logits[0, prompt_len - 1 : -1], temperature, top_k, top_p, repetition_penalty, prefixes
            ).cpu()
            q = None if drafter is None else drafter(seq[None]).logits[0, prompt_len - 1 : -1].argmax(-1).tolist()
        seq = seq.cpu()
        tokens = seq[prompt_len:]
        observed = observed + torch.bincount(tokens, minlength=p.shape[-1]).float()
        expected = expected + p.sum(0)
        s = seq.tolist()
        for i, x in enumerate(tokens.tolist()):
            guess = maxgram_guess(s, prompt_len + i)
            if guess is not None:
                copy.add(x == guess, float(p[i, guess]))
            if q is not None:
                draft.add(x == q[i], float(p[i, q[i]]))
    chi2, limit = pooled_chi2(observed, expected)
    return {
        "n": int(observed.sum()),
        "chi2": chi2,
        "limit": limit,
        "z_copy": copy.z,
        "z_draft": draft.z if drafter is not None else 0.0,
    }


def passes(stats: dict) -> bool:
    """The chi-square under its 1e-4 limit and every z-score within 4."""
    return (
        stats["chi2"] < stats["limit"] and abs(stats.get("z_copy", 0.0)) < 4.0 and abs(stats.get("z_draft", 0.0)) < 4.0
    )
