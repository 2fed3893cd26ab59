"""What verifying drafts costs, in units of a step that verifies none.

Two measures of one quantity, ``cost(n)``: the time of a verification of ``n`` drafted tokens or nodes over that of a
verification of none.

* :class:`VerifyCost` -- the target's profile by number of tree nodes, measured on the running device before the
  call's steps (Sequoia's hardware-aware sizing, Chen et al., 2024, Section 3.3): the tree policies
  (:class:`~hf_cascade.core.payoff.budget.AdaptiveBudget`) size each step from it. The layer receives the profile;
  the assistants measure it when they bind to a target (:mod:`hf_cascade.measure`).
* :class:`CostModel` -- a reviewer's cost of ``k`` drafts learned online from its own forward times, with a prior
  until a ``k`` has been measured: the chain rules (:class:`~hf_cascade.core.payoff.rules.AdaptiveLookahead`,
  :class:`~hf_cascade.core.payoff.rules.ExpectedGainRule`) and a batch's step times
  (:class:`~hf_cascade.core.payoff.gate.DraftGate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Gemma-3-270M fp32, 2 CPU threads (the reference machine of docs/design.md), n = 0..24 nodes.
_CPU_PROFILE = (
    1.0,
    1.0,
    1.039,
    1.039,
    1.054,
    1.153,
    1.225,
    1.225,
    1.271,
    1.354,
    1.425,
    1.454,
    1.671,
    1.711,
    1.93,
    1.93,
    1.93,
    1.93,
    1.93,
    1.93,
    1.93,
    1.93,
    1.982,
    1.982,
    1.982,
)


@dataclass(frozen=True)
class VerifyCost:
    """The cost of one verification of ``n`` tree nodes, in units of a one-token target forward.

    A node is verified when its expected return pays for what it adds to the step's cost *on the running
    hardware*, so the profile must be that hardware's: :func:`hf_cascade.measure.measure_verify_cost` measures it
    (the assistants do when they bind, unless :class:`hf_cascade.options.Policy` gives one); :meth:`flat` is a GPU
    far from its compute bound, :meth:`reference` one measured CPU's profile.

    Attributes:
        relative: ``relative[n]`` for ``n = 0 .. len - 1`` nodes (``relative[0] = 1``: the root alone, what a
            step of plain decoding costs), non-decreasing; larger ``n`` extend the mean slope of the table's
            second half (a measured profile rises in steps, so its very last slope is often 0).
    """

    relative: tuple[float, ...]

    def __post_init__(self) -> None:
        rel = tuple(float(c) for c in self.relative)
        if len(rel) < 2:
            raise ValueError(f"VerifyCost needs the cost of at least 0 and 1 nodes, got {rel}")
        if abs(rel[0] - 1.0) > 1e-6:
            raise ValueError(f"relative[0] is the unit (a one-token forward) and must be 1.0, got {rel[0]}")
        if any(b < a for a, b in zip(rel, rel[1:])):
            raise ValueError(f"verification costs must not decrease with the number of nodes, got {rel}")
        object.__setattr__(self, "relative", rel)

    @classmethod
    def reference(cls) -> VerifyCost:
        """The profile measured on the reference CPU (Gemma-3-270M, float32, 2 threads; ``docs/design.md``)."""
        return cls(_CPU_PROFILE)

    @classmethod
    def flat(cls) -> VerifyCost:
        """Every tree costs what one token costs (a GPU far from its compute bound): verify everything."""
        return cls((1.0, 1.0))

    def __call__(self, n: int) -> float:
        rel = self.relative
        if n < len(rel):
            return rel[n]
        half = (len(rel) - 1) // 2
        slope = (rel[-1] - rel[half]) / (len(rel) - 1 - half)
        return rel[-1] + (n - len(rel) + 1) * slope

    def scaled(self, scale: float) -> VerifyCost:
        """The profile with its increments over a plain step scaled: ``1 + scale * (cost(n) - 1)``. For a finite
        ``scale >= 0`` that is a valid profile already (``relative[0]`` stays 1, rounding keeps the order): made
        without :meth:`__post_init__`'s checks (a tree policy rescales at every drafted step); the same values."""
        relative = tuple(1.0 + scale * (c - 1.0) for c in self.relative)
        if not 0.0 <= scale < float("inf"):
            return VerifyCost(relative)  # checked (and refused where it decreases)
        made = object.__new__(VerifyCost)
        object.__setattr__(made, "relative", relative)
        return made


@dataclass
class CostModel:
    """Relative cost of one review of ``k`` drafts, ``cost(k) = t(k) / t(0)``.

    With ``measure=True`` the reviewer's forward times are recorded by :meth:`observe` and averaged
    (exponential moving average per ``k``); ``prior_slope``/``prior_step`` describe the curve until
    a ``k`` has been measured: ``cost(k) = 1 + prior_step * [k > 0] + prior_slope * k``.

    The seconds given to :meth:`observe` must be device time: on an accelerator kernels run
    asynchronously, so whoever times a forward synchronises the device before reading the clock, at
    both ends (:func:`hf_cascade.placement.synchronize`; ``NeuralLevel.scores(..., timed=True)`` does).
    """

    prior_step: float = 0.6
    prior_slope: float = 0.05
    measure: bool = True
    decay: float = 0.8
    _seconds: dict[int, float] = field(default_factory=dict)
    _costs: dict[tuple[int, float, float], float] = field(default_factory=dict, repr=False, compare=False)

    def observe(self, k: int, seconds: float) -> None:
        if not self.measure:
            return
        old = self._seconds.get(k)
        self._seconds[k] = seconds if old is None else self.decay * old + (1 - self.decay) * seconds
        self._costs.clear()

    def cost(self, k: int) -> float:
        """``cost(k)``, remembered until the next :meth:`observe` (the drafting rules ask for the same
        few ``k`` many times per draft)."""
        key = (k, self.prior_step, self.prior_slope)
        value = self._costs.get(key)
        if value is None:
            value = self._costs[key] = self._cost(k)
        return value

    def _cost(self, k: int) -> float:
        prior = 1.0 + self.prior_step * (k > 0) + self.prior_slope * k
        base = self._seconds.get(0)
        if base is None or base <= 0:
            return prior
        measured = self._seconds.get(k)
        if measured is None:
            # Interpolate from the nearest measured k > 0 (the first measured of equals), scaled by the prior's
            # shape (k > 0 here: k = 0 is the base, measured).
            j = min((m for m in self._seconds if m > 0), key=lambda m: abs(m - k), default=None)
            if j is None:
                return prior
            jprior = 1.0 + self.prior_step + self.prior_slope * j
            return max(1.0, (self._seconds[j] / base) * prior / jprior)
        return max(1.0, measured / base) if k else 1.0


__all__ = ["CostModel", "VerifyCost"]
