"""Draft sizes that pay on the running machine: one call's policy for the model-drafted trees (GLIDE, ReDrafter) and
Token Recycling.

A draft costs twice: the drafter's forwards, and the extra rows the target verifies. Both costs, and how often
the target accepts what the drafter proposes, depend on the machine, the target, the drafter and the prompt, so
they are measured during the call rather than fixed by flags (not in GLIDE's or ReDrafter's paper, which draft and
verify a fixed shape; the tree rule is Sequoia's and EAGLE-2's, :mod:`hf_cascade.core.payoff.rules`). Costs are in
*units*, the time of one verification step with no draft on this machine; ``R`` is the call's tokens per unit so
far, drafting and verification both counted (Dinkelbach: an action pays when its expected tokens exceed ``R``
times its cost). :class:`AdaptiveBudget` decides, per step:

1. **whether to draft at all** (:meth:`~AdaptiveBudget.should_draft`): the target's measured acceptance of the
   first drafted token must pay for one draft forward plus one verified row, ``a_1 >= R * (c_draft + cost(1) - 1)``;
   otherwise the step is a plain one (every ``explore_every``-th refused step drafts anyway, so an unlucky start
   does not silence the drafter for good: at most ``explore_tokens`` main tokens, :meth:`~AdaptiveBudget.draft_limit`,
   as the chain rules' exploring drafts; it measures the first token's acceptance, and a token rule 1 refused
   seldom pays for a deeper one);
2. **how deep to draft** (:meth:`~AdaptiveBudget.keep_drafting`): another draft forward can add at most the
   calibrated probability of reaching it, so drafting stops once ``reach < R * c_draft``;
3. **which nodes to verify** (:meth:`~AdaptiveBudget.select`): :func:`~hf_cascade.core.payoff.rules.keep_best` over
   the drafter's node probabilities *calibrated by the target's verdicts*
   (:class:`~hf_cascade.core.payoff.acceptance.AcceptanceCalibration`: a distilled drafter is overconfident away
   from its training prompts) with the measured cost profile (:class:`~hf_cascade.core.payoff.cost.VerifyCost`)
   and ``R``.

Verdicts and times feed back through :meth:`~AdaptiveBudget.observe_step`; the profile's increments are rescaled to
what this call's drafted steps measure against its plain ones (``AdaptiveBudget._rescale``: the profile times
verification alone, a real step also computes and samples the rows of the tokens it accepts). Every decision
depends on the context and on the past steps only (no random draws), so greedy decoding stays exact and point-mass
sampling stays lossless. One instance per ``generate()`` call: nothing learned leaks into the next call.
"""

from __future__ import annotations

import time

import torch

from ... import placement
from ..draws import keep_drawn
from ..structure import TokenTree
from .acceptance import AcceptanceCalibration
from .cost import VerifyCost
from .rules import keep_best, path_probabilities


class AdaptiveBudget:
    """Measured draft costs, calibrated acceptance and the rate ``R`` of one ``generate()`` call (see the module
    docstring). ``cost``: the resolved verification profile of the target on its device."""

    def __init__(
        self,
        cost: VerifyCost,
        explore_every: int = 8,
        prior_first: float = 0.5,
        prior_strength: float = 2.0,
        decay: float = 0.8,
        explore_tokens: int = 1,
    ):
        self.profile = cost  # the measured profile (its verification steps alone)
        self.cost = cost  # in use: the profile's increments scaled to this call's steps
        self.scale = 1.0
        self._plain_seconds: float | None = None  # seconds of a step with nothing drafted (EMA)
        self.calibration = AcceptanceCalibration()
        self.explore_every = int(explore_every)
        self.explore_tokens = int(explore_tokens)
        self.exploring = False  # the last should_draft() passed only as an exploring step
        self.decay = float(decay)
        self.tokens = 1.0  # R starts from one imaginary plain step: one token per unit
        self.units = 1.0
        self.unit_seconds: float | None = None  # seconds of one unit (EMA of verify seconds / cost(nodes))
        self.forward_seconds: float | None = None  # seconds of one draft forward (EMA)
        self._first = [prior_first * prior_strength, prior_strength]  # accepted, tried: the first drafted token
        self._skips = 0
        self._draft_started: float | None = None
        self._draft_forwards = 0

    # -- estimates -------------------------------------------------------------------------------
    @property
    def rate(self) -> float:
        """``R``: tokens emitted per unit of cost so far (drafting included)."""
        return self.tokens / self.units

    def draft_cost(self) -> float:
        """One draft forward in units (0 until both times are measured)."""
        if not self.unit_seconds or self.forward_seconds is None:
            return 0.0
        return self.forward_seconds / self.unit_seconds

    def first_acceptance(self) -> float:
        return self._first[0] / self._first[1]

    # -- decisions -------------------------------------------------------------------------------
    def should_draft(self) -> bool:
        """Whether this step drafts (rule 1 of the module docstring)."""
        self.exploring = False
        if self.first_acceptance() >= self.rate * (self.draft_cost() + self.cost(1) - self.cost(0)):
            return True
        self._skips += 1
        self.exploring = self.explore_every > 0 and self._skips % self.explore_every == 0
        return self.exploring

    def draft_limit(self, k: int) -> int:
        """The most main tokens this step drafts, of ``k``: at most ``explore_tokens`` on an exploring step."""
        return min(k, max(self.explore_tokens, 1)) if self.exploring else k

    def keep_drafting(self, reach: float) -> bool:
        """Whether another draft forward can pay, after a path the target reaches with calibrated
        probability ``reach`` (rule 2)."""
        return reach >= self.rate * self.draft_cost()

    def calibrated(self, p: float) -> float:
        return self.calibration(p)

    def calibrated_all(self, probs: list[float]) -> list[float]:
        """:meth:`calibrated` of each of ``probs`` (host floats); for more than two, through the calibration's
        :meth:`~hf_cascade.core.payoff.acceptance.AcceptanceCalibration.frozen` ratios, made once (the same values)."""
        calibrated = self.calibration.frozen() if len(probs) > 2 else self.calibration
        return [calibrated(p) for p in probs]

    def select(self, tree: TokenTree, node_probs, fixed: int = 0) -> tuple[TokenTree, list[float]]:
        """The nodes of ``tree`` worth verifying (rule 3), and their draft probabilities (host floats, node
        order of the returned tree). ``node_probs``: ``[n]`` the drafter's probability of each node's token given
        its parent (one host read). ``fixed``: the first ``fixed`` nodes are kept whatever they are worth (a
        drawn main path, whose length was decided before each draw: :func:`hf_cascade.core.draws.keep_drawn`)."""
        probs = (
            torch.as_tensor(node_probs, dtype=torch.float64).tolist()
            if not isinstance(node_probs, list)
            else node_probs
        )
        if tree.num_nodes == 0:
            return tree, []
        kept = keep_drawn(self.keep(tree, self.calibrated_all(probs)), fixed)
        return tree.select(kept), [p for p, k in zip(probs, kept) if k]  # host bools: no read

    def keep(self, tree: TokenTree, acceptance: list[float]) -> list[bool]:
        """Rule 3 on estimates of each node's acceptance given its parent's (host floats, node order; e.g.
        calibrated already): which nodes to verify."""
        return keep_best(path_probabilities(tree.host_parents, acceptance), self.cost, self.rate)

    # -- measurements ----------------------------------------------------------------------------
    def start_draft(self, device: torch.device | None = None) -> None:
        """Before the drafter's first forward of this step, on ``device`` (the target's input device, where the step
        before updated the cache). The drafter's measured time decides what is drafted, so the clock starts after that
        device's queued work, which no phase waits for (:func:`~hf_cascade.placement.synchronize`; ``None``: the
        current accelerator; nothing on a CPU)."""
        placement.synchronize(device)
        self._draft_started, self._draft_forwards = time.perf_counter(), 0

    def count_forward(self, n: int = 1) -> None:
        self._draft_forwards += n

    def end_draft(self) -> None:
        """After the drafter's last host read of this step (the device is synchronised there)."""
        if self._draft_started is None:
            return
        seconds = time.perf_counter() - self._draft_started
        self._draft_started = None
        if self._draft_forwards:
            per = seconds / self._draft_forwards
            self.forward_seconds = (
                per if self.forward_seconds is None else (self.decay * self.forward_seconds + (1 - self.decay) * per)
            )
            self.units += self.draft_cost() * self._draft_forwards

    def observe_step(
        self,
        tree: TokenTree,
        probs: list[float],
        path: list[int],
        emitted: int,
        verify_seconds: float | None,
        verify_nodes: int | None = None,
    ) -> None:
        """One verification of ``tree`` (draft probabilities ``probs``, node order; ``None`` for a node the
        drafter did not propose, e.g. a lookup seed: neither calibrated nor counted for rule 1) that accepted
        ``path`` and emitted ``emitted`` tokens in ``verify_seconds`` (``None``: not measured).
        ``verify_nodes``: in a batch, the widest row's draft (:attr:`TreeStep.verify_nodes`), which sets the
        step's cost: the step is charged, timed and rescaled as a verification of that many nodes, so that
        a step where this row drafted nothing but another row did is not taken for a plain one."""
        n = tree.num_nodes
        paid = n if verify_nodes is None else max(int(verify_nodes), n)
        self.tokens += emitted
        self.units += self.cost(paid)
        if verify_seconds is not None and verify_seconds > 0:
            per = verify_seconds / self.cost(paid)
            self.unit_seconds = (
                per if self.unit_seconds is None else self.decay * self.unit_seconds + (1 - self.decay) * per
            )
            self._rescale(paid, verify_seconds)
        if not n or len(probs) != n:  # nothing drafted, or a tree the loop cut (EOS, length)
            return
        on_path = set(path)
        parents = tree.host_parents
        for i, p in enumerate(probs):  # a node is reached when its parent was accepted (or is the root)
            if p is not None and (parents[i] < 0 or parents[i] in on_path):
                self.calibration.observe(p, i in on_path)
        firsts = [i for i in range(n) if parents[i] < 0 and probs[i] is not None]
        if firsts:
            self._first[0] += float(any(i in on_path for i in firsts))
            self._first[1] += 1.0

    def _rescale(self, n: int, seconds: float) -> None:
        """The profile times a verification step alone; in a call, a step that verifies nodes also computes the
        output-head rows of the tokens it accepts and processes and samples them, which the profile's steps
        (never accepted) do not. So the call measures its own steps: ``scale``, an EMA of each drafted step's
        excess over the call's plain steps (nothing drafted) relative to the profile's excess for its size,
        multiplies the profile's increments (``cost(n) = 1 + scale * (profile(n) - 1)``). Without plain steps
        measured the profile stands."""
        if n == 0:
            self._plain_seconds = (
                seconds
                if self._plain_seconds is None
                else (self.decay * self._plain_seconds + (1 - self.decay) * seconds)
            )
            return
        excess = self.profile(n) - 1.0
        if self._plain_seconds is None or excess < 0.02:
            return
        ratio = min(max((seconds / self._plain_seconds - 1.0) / excess, 0.25), 4.0)
        self.scale = self.decay * self.scale + (1 - self.decay) * ratio
        self.cost = self.profile.scaled(self.scale)


__all__ = ["AdaptiveBudget"]
