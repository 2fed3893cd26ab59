"""Whether drafting pays: the one layer of the rules that decide what is drafted and verified beyond the papers'
fixed shapes. Every rule decides what is drafted, never what is accepted, so all are lossless.

One rule in several forms: a drafted token is proposed, or a tree node verified, where its expected accepted tokens
pay for what it adds to the step's time at the generation's current rate (Dinkelbach's argument: per step, maximize
``expected tokens - R * cost``, ``R`` the tokens per unit of time so far; Leviathan et al.'s expected tokens per
review for chains; Sequoia's measured cost profile and EAGLE-2's path-probability ranking for trees).

* :mod:`.cost` -- what verifying costs: :class:`VerifyCost` (the target's profile by number of nodes on its device)
  and :class:`CostModel` (a reviewer's cost of ``k`` drafts, learned online from its forward times);
* :mod:`.acceptance` -- what the target accepts: :class:`AcceptanceCalibration` (a drafter's probabilities
  calibrated online by the target's verdicts);
* :mod:`.rules` -- the rule for chains (:class:`AdaptiveLookahead`, :class:`ExpectedGainRule`), for a drafter's
  forwards (:class:`DrafterPayoff`) and for trees (:func:`path_probabilities`, :func:`best_size`, :func:`keep_best`);
* :mod:`.budget` -- :class:`AdaptiveBudget`, one call's policy for drafted trees (GLIDE, ReDrafter, Token Recycling);
* :mod:`.gate` -- :class:`DraftGate`, one batched call's policy (which rows draft, how wide);
* :mod:`.policy` -- :class:`DraftPolicy`, the one object a drafter asks (built once per call from the assistant's
  ``Policy`` and the measured profile): the only place the rules above are built.

The layer answers questions from measured numbers it is given (a cost profile, forward and step times, the
target's verdicts) and imports nothing above the core: measuring the device's verification cost is the assistants'
job when they bind to a target (:mod:`hf_cascade.measure`); which rules apply is the assistants' options.
"""

from .acceptance import AcceptanceCalibration
from .budget import AdaptiveBudget
from .cost import CostModel, VerifyCost
from .gate import DraftGate, lagging_rows
from .policy import DraftPolicy
from .rules import (
    AdaptiveLookahead,
    DrafterPayoff,
    ExpectedGainRule,
    best_size,
    keep_best,
    path_probabilities,
)

__all__ = [
    "AcceptanceCalibration",
    "AdaptiveBudget",
    "AdaptiveLookahead",
    "CostModel",
    "DraftGate",
    "DraftPolicy",
    "DrafterPayoff",
    "ExpectedGainRule",
    "VerifyCost",
    "best_size",
    "keep_best",
    "lagging_rows",
    "path_probabilities",
]
