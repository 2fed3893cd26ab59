"""HSDDW's own settings (:class:`DynamicWindowSettings`), apart from the candidate generator that runs them."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from ..options import Options
from .rules import check_threshold

#: Default cap of the window the target verifies, in multiples of ``max_window`` (the authors' code
#: hands the accumulated tokens to the target once there are more than 50, with K = 10).
TARGET_WINDOW_FACTOR = 5


@dataclass(frozen=True)
class DynamicWindowSettings(Options):
    """The windows of HSDDW (Algorithms 1 and 2 of the paper); the defaults are the paper's. What is drafted beyond
    them on the running machine is the assistant's :class:`~hf_cascade.options.Policy`.

    Attributes:
        max_window: most tokens the draft model drafts per Draft + Self-verify stage (the paper's ``K``; 10 in its
            experiments).
        tau_init: the draft model's starting confidence threshold (nats). The paper starts at 0: the first token
            always stops the window (one token per window) until the first rejection. ``float("inf")`` disables
            self-verify (fixed windows of ``max_window``).
        tau2_init: the pre-verifier's starting threshold (same conventions).
        max_target_window: most tokens handed to the target per step with a pre-verifier (``None``:
            ``5 * max_window``); only with a ``verifier_model``.
    """

    max_window: int = 10
    tau_init: float = 0.0
    tau2_init: float = 0.0
    max_target_window: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_window", _check_int(self.max_window, "max_window"))
        if self.max_target_window is not None:
            object.__setattr__(self, "max_target_window", _check_int(self.max_target_window, "max_target_window"))
        object.__setattr__(self, "tau_init", check_threshold(self.tau_init, "tau_init"))
        object.__setattr__(self, "tau2_init", check_threshold(self.tau2_init, "tau2_init"))

    @property
    def target_window(self) -> int:
        """The most tokens handed to the target per step with a pre-verifier."""
        return TARGET_WINDOW_FACTOR * self.max_window if self.max_target_window is None else self.max_target_window


def _check_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}.")
    value = int(value)
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}.")
    return value


__all__ = ["TARGET_WINDOW_FACTOR", "DynamicWindowSettings"]
