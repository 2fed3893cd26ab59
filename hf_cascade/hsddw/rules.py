"""The two rules of *self-verify* (HSDDW §3.1, §4.4; Algorithms 1 and 2), as small pure pieces.

* **Stop rule.** A drafter emits tokens one at a time and computes the entropy ``H(q_i)`` of the
  (processed) distribution each token comes from. It keeps going while ``H(q_i) <= tau`` and stops
  *after* the first token with ``H(q_i) > tau``: that token is kept (Algorithm 1 sets ``l = i`` before
  the ``break``; the authors' ``KVCacheModelEntropyGamma`` appends the token before testing).
  With the paper's starting ``tau = 0`` every window is one token until the first rejection.
* **Threshold update.** ``tau`` is the mean entropy of every token of this sequence that the
  drafter's reviewer rejected so far (§4.4: ``tau = 1/|S_reject| * sum_{i in S_reject} H(q_i)``).
  Algorithm 1 line 26 writes ``H(q_n)``; with ``n`` accepted tokens that is the 0-based index of the
  first rejected token, which is what the authors' code appends (``reject_entropy.append(entropys[i])``
  at the rejected ``i``). The starting value is used only until the first rejection; it is not part
  of the mean.

Entropies are natural-log (nats), like ``torch.distributions.Categorical.entropy`` in the authors'
code, with ``0 log 0 = 0`` (tokens masked by top-k, bad words, ... contribute nothing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """``H(p) = -sum_v p(v) log p(v)`` in nats over the last dimension (``[..., V] -> [...]``)."""
    return torch.special.entr(probs.float()).sum(dim=-1)


def self_verify_length(entropies, tau: float) -> int:
    """How many of the tokens with these entropies a self-verifying drafter keeps: all of them up to
    and including the first one whose entropy exceeds ``tau`` (``H > tau`` stops, ``H == tau`` does not)."""
    values = entropies.tolist() if isinstance(entropies, torch.Tensor) else list(entropies)
    for i, h in enumerate(values):
        if h > tau:
            return i + 1
    return len(values)


def check_threshold(value: float, name: str) -> float:
    """A valid starting threshold: a number ``>= 0`` (``inf`` disables self-verify: fixed windows)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}.")
    value = float(value)
    if math.isnan(value) or value < 0:
        raise ValueError(f"{name} must be >= 0 (an entropy in nats), got {value}.")
    return value


@dataclass
class EntropyThreshold:
    """The confidence threshold ``tau`` of one drafter for one sequence.

    Attributes:
        value: the current ``tau`` (``initial`` until the first rejection).
        rejected: ``H(q_i)`` of every token of this drafter its reviewer rejected, in order.
    """

    initial: float = 0.0
    value: float = field(init=False)
    rejected: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.initial = check_threshold(self.initial, "tau")
        self.value = self.initial

    def update(self, rejected_entropy: float) -> float:
        """A token with entropy ``rejected_entropy`` was rejected: ``tau = mean(rejected entropies)``."""
        self.rejected.append(float(rejected_entropy))
        self.value = sum(self.rejected) / len(self.rejected)
        return self.value
