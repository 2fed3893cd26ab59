"""One call's draft policy: the one object a drafter asks whether drafting pays (:class:`DraftPolicy`).

The rules of this layer (:mod:`.rules`, :mod:`.budget`, :mod:`.acceptance`, :mod:`.cost`) are built here and
nowhere else: an assistant builds one :class:`DraftPolicy` per ``generate()`` call (per row in a batch: each row's
drafter learns from its own verdicts) from its :class:`hf_cascade.options.Policy` and the target's measured
verification profile (:class:`~.cost.VerifyCost`), and hands it to its drafter. The drafter proposes scored
candidates (its probabilities, a match's evidence bucket, its forwards' times); the policy answers

* **what to draft** -- :meth:`DraftPolicy.plan` (a tree: draft at all, how many main tokens),
  :meth:`DraftPolicy.deeper` (another draft forward), :meth:`DraftPolicy.lookahead` (a chain's length rule, per
  drafter and reviewer), :meth:`DraftPolicy.consult` / :meth:`DraftPolicy.token_rule` (a neural drafter's forwards
  and its tokens for the target);
* **which drafted nodes to verify** -- :meth:`DraftPolicy.select`, :meth:`DraftPolicy.keep`;
* and learns **what was accepted** -- :meth:`DraftPolicy.observe`, :meth:`DraftPolicy.observe_consult`,
  :meth:`DraftPolicy.observe_window`, :meth:`DraftPolicy.calibrate`.

With ``cost_aware`` off (``Policy(cost_aware=False)``, the papers' shapes) every answer is the paper's: draft what
the settings say, verify every node, consult at every step; so the drafters hold no ``cost_aware`` branch. A
batch's gate over rows is :class:`~.gate.DraftGate` (:mod:`.gate`). Every answer depends on the context and the
past steps only, never on a random draw: outputs do not depend on the policy.
"""

from __future__ import annotations

from .acceptance import AcceptanceCalibration
from .budget import AdaptiveBudget
from .cost import CostModel, VerifyCost
from .rules import AdaptiveLookahead, DrafterPayoff, ExpectedGainRule


class DraftPolicy:
    """What one ``generate()`` call drafts and verifies (module docstring).

    Args:
        cost_aware: the rules apply (``False``: the papers' fixed shapes).
        verify_cost: the target's measured verification profile, which sizes trees (:class:`~.budget.AdaptiveBudget`);
            ``None``: trees are verified whole (a chain drafter's rules measure their own costs).
        lookup: the sequence's repeats may join a tree as a lookup branch, cut by the same rule (only where trees
            are cut: with ``verify_cost``).
    """

    def __init__(self, cost_aware: bool = True, verify_cost: VerifyCost | None = None, lookup: bool = False):
        self.cost_aware = bool(cost_aware)
        #: the tree rule (whether to draft, how deep, which nodes); ``None``: the paper's fixed tree
        self.budget = AdaptiveBudget(verify_cost) if cost_aware and verify_cost is not None else None
        self.lookup = bool(lookup) and self.budget is not None
        #: a drafter's own probabilities -> the target's acceptance (the cascade's smallest drafter, recycled rows)
        self.calibration = AcceptanceCalibration()
        #: the target's verification time by draft length (a chain's token rule)
        self.target_cost = CostModel()
        #: whether a neural drafter's forwards pay; ``None``: it is consulted at every step (the paper)
        self.payoff = DrafterPayoff() if cost_aware else None
        # the target's step time by draft length, rows free until a plain step is measured (observe_window)
        self._step_cost = CostModel(prior_step=0.0, prior_slope=0.0)

    @classmethod
    def of(cls, policy, verify_cost: VerifyCost | None = None, lookup: bool | None = None) -> DraftPolicy:
        """The policy of one call under ``policy`` (a :class:`hf_cascade.options.Policy`: its ``cost_aware`` and
        ``lookup``) with the bound profile ``verify_cost`` (:func:`hf_cascade.measure.bound_verify_cost`)."""
        return cls(policy.cost_aware, verify_cost, policy.lookup if lookup is None else lookup)

    # -- trees ---------------------------------------------------------------------------------------
    @property
    def reads_scores(self) -> bool:
        """Whether the tree rule reads the drafter's node probabilities (without it, a drafter need not compute
        them)."""
        return self.budget is not None

    def plan(self, depth: int) -> int:
        """How many main tokens this step drafts, of the ``depth`` the settings and the length allow: 0 where
        drafting does not pay (:meth:`AdaptiveBudget.should_draft`), an exploring step's few
        (:meth:`AdaptiveBudget.draft_limit`), else ``depth``."""
        if depth < 1:
            return 0
        budget = self.budget
        if budget is None:
            return depth
        return budget.draft_limit(depth) if budget.should_draft() else 0

    def calibrated(self, p: float) -> float:
        """A tree drafter's probability ``p`` as the target's acceptance (``p`` itself without the tree rule)."""
        return self.budget.calibrated(p) if self.budget is not None else p

    def deeper(self, reach: float) -> bool:
        """Whether another draft forward can pay after a path reached with calibrated probability ``reach``."""
        return self.budget is None or self.budget.keep_drafting(reach)

    def calibrated_all(self, probs: list[float]) -> list[float]:
        return self.budget.calibrated_all(probs) if self.budget is not None else list(probs)

    def select(self, tree, node_probs, fixed: int = 0):
        """The nodes of ``tree`` worth verifying and their draft probabilities (:meth:`AdaptiveBudget.select`);
        the whole tree without the tree rule (probabilities not read: ``[]``)."""
        if self.budget is None:
            return tree, []
        return self.budget.select(tree, node_probs, fixed)

    def keep(self, tree, acceptance: list[float]) -> list[bool]:
        """Which nodes to verify, from estimates of each node's acceptance given its parent's (all without the
        tree rule)."""
        if self.budget is None:
            return [True] * tree.num_nodes
        return self.budget.keep(tree, acceptance)

    def start_draft(self, device=None) -> None:
        """Before a tree drafter's first forward of a step (its time sizes the next drafts)."""
        if self.budget is not None:
            self.budget.start_draft(device)

    def count_forward(self, n: int = 1) -> None:
        if self.budget is not None:
            self.budget.count_forward(n)

    def end_draft(self) -> None:
        if self.budget is not None:
            self.budget.end_draft()

    def observe(
        self,
        tree,
        probs: list,
        path: list[int],
        emitted: int,
        verify_seconds: float | None,
        verify_nodes: int | None = None,
    ) -> None:
        """The target's verdict on a tree (:meth:`AdaptiveBudget.observe_step`)."""
        if self.budget is not None:
            self.budget.observe_step(tree, probs, path, emitted, verify_seconds, verify_nodes)

    # -- chains --------------------------------------------------------------------------------------
    @staticmethod
    def lookahead(drafter) -> AdaptiveLookahead:
        """A fresh length rule for one statistical drafter and one reviewer, from what the drafter declares
        (Max-Gram's ``max_tokens``, ``priors()`` per evidence bucket, ``adaptive``, a fixed reviewer ``cost``)."""
        cost = drafter.cost
        model = (
            CostModel(**{k: getattr(cost, k) for k in ("prior_step", "prior_slope", "measure", "decay")})
            if cost is not None
            else CostModel()
        )
        return AdaptiveLookahead(
            max_tokens=drafter.max_tokens, bucket_priors=drafter.priors(), cost=model, adaptive=drafter.adaptive
        )

    def token_rule(self, accept) -> ExpectedGainRule | None:
        """The floor on a neural drafter's next target-bound tokens after a draft whose tokens the target accepts
        with estimates ``accept`` (a callable giving them: not evaluated without the rule); ``None``: no floor."""
        if self.payoff is None:
            return None
        return ExpectedGainRule.after(accept(), self.target_cost, self.calibration)

    def consult(self, reach: float) -> bool:
        """Whether to run a neural drafter's forwards at ``reach`` (:meth:`DrafterPayoff.worth`; always without
        the rule)."""
        return self.payoff is None or self.payoff.worth(reach)

    def observe_consult(self, reach: float, seconds: float) -> None:
        if self.payoff is not None:
            self.payoff.observe_consult(reach, seconds)

    def observe_verdict(self, accepted: int, emitted: int, step_seconds: float | None) -> None:
        if self.payoff is not None:
            self.payoff.observe_verdict(accepted, emitted, step_seconds)

    def calibrate(self, p: float, accepted: bool) -> None:
        """A neural drafter's token of probability ``p`` was reached by the target and ``accepted`` or not."""
        if self.payoff is not None:
            self.calibration.observe(p, accepted)

    def observe_target(self, proposed: int, seconds: float | None) -> None:
        """The target verified ``proposed`` drafted tokens in ``seconds`` (``None``: not measured)."""
        if seconds is not None:
            self.target_cost.observe(proposed, seconds)

    def observe_window(self, proposed: int, accepted: int, seconds: float | None, consulted: float | None) -> None:
        """A step whose draft no rule sized (HSDDW's entropy window): the draft models' forwards (``consulted``
        seconds, ``None``: they did not run) are charged with the share of the step their rows took (``1 - 1 /
        cost(k)`` of it, by this call's measured step times), and their accepted tokens counted."""
        if self.payoff is None:
            return
        if seconds is not None:
            self._step_cost.observe(proposed, seconds)
        if consulted is not None:
            surcharge = 0.0 if seconds is None else seconds * (1.0 - 1.0 / self._step_cost.cost(proposed))
            self.payoff.observe_consult(1.0, consulted, surcharge)
        self.payoff.observe_verdict(accepted if consulted is not None else 0, accepted + 1, seconds)


__all__ = ["DraftPolicy"]
