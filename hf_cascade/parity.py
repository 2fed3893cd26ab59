"""Where two greedy outputs part, and whether the target's own logits make that a tie.

Verification scores several tokens in one forward; plain decoding scores one. The two run different kernels
(another block shape, another reduction order), so in bf16 / fp16 their logits differ in the last bits, and a
position whose two best logits are that close may pick either token: both paths are right, and the outputs
differ from there on. In float32 the same differences are far below any logit gap seen in practice, so outputs
must be identical there (``examples/gpu_check.py`` fails on any float32 difference).

The rule of :func:`divergence`: at the first position where the outputs differ, the target scores the plain
path's prefix once; the divergence is a **tie** when the logit of the token the plain path chose (its top-1)
exceeds the logit of the token the other path chose by at most ``ulps`` units in the last place of the target's
compute dtype at the top-1 logit's magnitude (:func:`ulp`; ``ulps`` defaults to :data:`TIE_ULPS`). Otherwise it
is a real mismatch. ``gap`` (top-1 minus top-2) is reported too; it is the deciding gap when the other path chose
the runner-up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: Units in the last place within which two logits are a tie (rounding of the compute dtype, several kernels).
TIE_ULPS = 4


def ulp(value: float, dtype: torch.dtype) -> float:
    """The spacing of ``dtype``'s floating-point numbers at ``|value|`` (its unit in the last place there)."""
    info = torch.finfo(dtype)
    magnitude = max(abs(float(value)), info.tiny)
    return info.eps * 2.0 ** math.floor(math.log2(magnitude))


def first_divergence(expected, got) -> int | None:
    """The first index where the token sequences ``expected`` and ``got`` differ (the shorter one's length when
    one is a prefix of the other), ``None`` when they are identical."""
    a = expected.tolist() if isinstance(expected, torch.Tensor) else list(expected)
    b = got.tolist() if isinstance(got, torch.Tensor) else list(got)
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@dataclass(frozen=True)
class Divergence:
    """The first difference between a plain output and another (see the module docstring).

    Attributes:
        position: index in the sequences (prompt included) of the first differing token.
        expected / got: the plain path's token there and the other path's (``-1``: that sequence had ended).
        top1 / top2: the target's two largest logits after the plain path's prefix.
        gap: ``top1 - top2``.
        got_gap: ``top1`` minus the logit of ``got`` (``inf`` when a sequence had ended: never a tie).
        tolerance: ``ulps`` units in the last place of the compute dtype at ``|top1|``.
    """

    position: int
    expected: int
    got: int
    top1: float
    top2: float
    gap: float
    got_gap: float
    tolerance: float

    @property
    def tie(self) -> bool:
        """Whether the other path's token is within rounding of the plain path's: both are right."""
        return self.got_gap <= self.tolerance


def logit_gap(
    logits: torch.Tensor, position: int, expected: int, got: int, dtype: torch.dtype, ulps: float = TIE_ULPS
) -> Divergence:
    """The :class:`Divergence` at ``position`` from the target's ``[V]`` logits after the plain path's prefix."""
    row = logits.detach().float().flatten().cpu()
    top = torch.topk(row, 2).values.tolist()
    got_gap = top[0] - float(row[got]) if 0 <= got < row.numel() and expected >= 0 else math.inf
    return Divergence(
        position, int(expected), int(got), top[0], top[1], top[0] - top[1], got_gap, ulps * ulp(top[0], dtype)
    )


@torch.no_grad()
def divergence(model, expected, got, ulps: float = TIE_ULPS) -> Divergence | None:
    """The first divergence of ``got`` from ``expected`` (``model``'s plain greedy output; both ``[L]`` token ids,
    prompt included), judged by one forward of ``model`` over ``expected``'s prefix; ``None`` when identical.
    The tolerance is in the dtype of ``model``'s input embeddings (the dtype its hidden states are computed in)."""
    from .placement import target_device_dtype

    position = first_divergence(expected, got)
    if position is None:
        return None
    a = expected.tolist() if isinstance(expected, torch.Tensor) else list(expected)
    b = got.tolist() if isinstance(got, torch.Tensor) else list(got)
    device, dtype = target_device_dtype(model)
    prefix = torch.tensor([a[:position]], dtype=torch.long, device=device)
    logits = model(input_ids=prefix).logits[0, -1]
    token = lambda seq: seq[position] if position < len(seq) else -1  # noqa: E731
    return logit_gap(logits, position, token(a), token(b), dtype if dtype.is_floating_point else torch.float32, ulps)


__all__ = ["TIE_ULPS", "Divergence", "divergence", "first_divergence", "logit_gap", "ulp"]
