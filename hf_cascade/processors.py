"""Logits processing shared by drafters and the target, and the opt-in *lossy* target rules.

Drafts are scored through the same :class:`~transformers.LogitsProcessorList` the target uses
(temperature, top-k/top-p, repetition penalty, no-repeat-ngram, bad words, ...), position by
position with the same ``input_ids`` prefix transformers' assisted loop gives the target, so a
draft distribution ``q`` and the target distribution ``p`` live in the same processed space.

The two :class:`DraftAwareProcessor` subclasses below change what the *target* accepts. They are
**lossy**: outputs no longer follow the target's distribution (greedy outputs may differ from plain
``generate``). Pass them explicitly, ``generate(..., logits_processor=[LossyLenientTarget(2.0)])``;
drafters never see them.
"""

from __future__ import annotations

import copy
import math

import torch
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import (
    PrefixConstrainedLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
)


def process_positions(
    processors: LogitsProcessorList, sequence: torch.Tensor, logits: torch.Tensor, start: int
) -> torch.Tensor:
    """Apply ``processors`` to every position of ``logits`` like transformers' assisted loop does.

    Args:
        processors: the list to apply (may be empty).
        sequence: ``[1, L]`` tokens; position ``i`` of ``logits`` predicts ``sequence[:, start + i]``.
        logits: ``[1, m, V]`` raw logits (float32).
        start: index in ``sequence`` of the token predicted by ``logits[:, 0]``.
    Returns:
        ``[1, m, V]`` processed scores (a new tensor when anything was applied).
    """
    if len(processors) == 0:
        return logits
    out = logits.clone()
    for i in range(logits.shape[1]):
        out[:, i, :] = processors(sequence[:, : start + i], out[:, i, :])
    return out


class DraftAwareProcessor(LogitsProcessor):
    """Base of target-side rules that need to see the current draft.

    The candidate generators of ``hf_cascade`` call :meth:`set_candidates` with the full candidate
    sequence ``[1, L + k]`` before the target's verification pass; at a prefix of length ``m`` the
    draft token under review is ``candidates[0, m]``.
    """

    def __init__(self) -> None:
        self._candidates: torch.Tensor | None = None

    def set_candidates(self, candidates: torch.Tensor | None) -> None:
        self._candidates = candidates

    def _draft_token(self, input_ids: torch.Tensor) -> int | None:
        c, m = self._candidates, input_ids.shape[1]
        if c is None or m >= c.shape[1] or not torch.equal(c[:, :m], input_ids):
            return None
        return int(c[0, m])

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        token = self._draft_token(input_ids)
        if token is None:
            return scores
        logp = scores.float().log_softmax(dim=-1)
        if not self._accepts(logp[0], token):
            return scores
        out = torch.full_like(scores, -math.inf)
        out[:, token] = 0.0  # the draft becomes the target's only choice: accepted under greedy and sampling
        return out

    def _accepts(self, logp: torch.Tensor, token: int) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError


class LossyLenientTarget(DraftAwareProcessor):
    """LOSSY. Lenience at the target (Leviathan et al. §A.5; CS Drafting §3.1 applies it only between
    drafters): the target accepts a draft token ``x`` when ``lenience * p(x) >= max_y p(y)``.

    Outputs differ from the target's own; use only when that trade-off is wanted.
    """

    def __init__(self, lenience: float) -> None:
        super().__init__()
        if lenience < 1.0:
            raise ValueError(f"lenience must be >= 1, got {lenience}")
        self.log_lenience = math.log(lenience)

    def _accepts(self, logp: torch.Tensor, token: int) -> bool:
        return bool(logp[token] + self.log_lenience >= logp.max())


class LossyTypicalAcceptance(DraftAwareProcessor):
    """LOSSY. Typical acceptance (Medusa, Cai et al. 2024 §2.3.1; used by ReDrafter): the target
    accepts a draft token ``x`` when ``p(x) > min(epsilon, delta * exp(-H(p)))``.

    Outputs do not follow the target's distribution; use only when that trade-off is wanted.
    """

    def __init__(self, epsilon: float = 0.09, delta: float = 0.3) -> None:
        super().__init__()
        self.epsilon, self.delta = epsilon, delta

    def _accepts(self, logp: torch.Tensor, token: int) -> bool:
        p = logp.exp()
        entropy = -(p * logp.clamp_min(-1e4)).sum()
        return bool(p[token] > min(self.epsilon, self.delta * float(torch.exp(-entropy))))


def split_processors(processors: LogitsProcessorList | None) -> tuple[LogitsProcessorList, list[DraftAwareProcessor]]:
    """Separate the lossless processors (shared with drafters) from the draft-aware target rules."""
    processors = processors or LogitsProcessorList()
    shared = LogitsProcessorList(p for p in processors if not isinstance(p, DraftAwareProcessor))
    aware = [p for p in processors if isinstance(p, DraftAwareProcessor)]
    return shared, aware


def screen_top_k(processors: LogitsProcessorList | None) -> int | None:
    """``k`` where the processed rows are functions of each row's ``k`` largest raw logits alone: the first
    processor that is not a temperature is a ``TopKLogitsWarper`` (a positive temperature keeps the order; every
    processor after the filter sees a row equal to the full row's). ``None`` for anything else. Rows whose other
    outputs are ``-inf`` then process to the same rows
    (:meth:`~hf_cascade.backends.cpu.argmax_screen.ArgmaxScreen.top`)."""
    for p in processors or []:
        if type(p) is TopKLogitsWarper:
            return int(p.top_k) if p.filter_value == float("-inf") else None
        if type(p) is not TemperatureLogitsWarper or not float(p.temperature) > 0:
            return None
    return None


def row_processors(processors: LogitsProcessorList | None, b: int, padded: bool = True) -> LogitsProcessorList:
    """Row ``b``'s view of a batch's logits processors, called with that row alone (``input_ids`` ``[1, L]``):
    those that index the batch see row ``b`` -- transformers' repetition penalty (``prompt_ignore_length``:
    each row's left padding) and ``prefix_allowed_tokens_fn`` (given the row's batch id, not 0).
    ``padded=False``: the view of row ``b``'s drafters, whose sequences carry no padding (nothing to ignore)."""
    out = LogitsProcessorList()
    for p in processors or []:
        ignore = getattr(p, "prompt_ignore_length", None)  # transformers >= 5: per row, a tensor
        if isinstance(p, RepetitionPenaltyLogitsProcessor) and isinstance(ignore, torch.Tensor):
            p = copy.copy(p)
            p.prompt_ignore_length = ignore[b : b + 1] if padded else None
        elif isinstance(p, PrefixConstrainedLogitsProcessor):
            p, fn = copy.copy(p), p._prefix_allowed_tokens_fn
            p._prefix_allowed_tokens_fn = lambda _, sent, fn=fn, b=b: fn(b, sent)
        out.append(p)
    return out
