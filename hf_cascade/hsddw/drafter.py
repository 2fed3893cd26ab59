"""HSDDW as a transformers ``CandidateGenerator`` (Algorithms 1 and 2 of *Hierarchical Speculative
Decoding with Dynamic Window*).

One draft model (Algorithm 1, SD + Self-verify): the draft model drafts with the stop rule of
:mod:`~hf_cascade.hsddw.rules` against ``tau`` (at most ``max_window`` tokens); the target verifies
(transformers' own loop); the entropy of the first rejected token updates ``tau``.

With a pre-verifier (Algorithm 2), each target step accumulates tokens through repeated
**Draft + Self-verify** (small model, ``tau``) -> **Pre-verify + Self-verify** (the stronger draft
model reviews the small model's window in one forward by speculative sampling, greedy: argmax match;
its rejections update ``tau``; it keeps its output tokens up to and including the first one whose
own entropy exceeds ``tau2``) until it is unsure, then **Verify** (the target checks everything
accumulated; its rejections update ``tau2``).

Lossless: every token handed to the target carries the exact distribution it was drawn from: the
small model's processed ``q`` (Algorithm 1), or, after pre-verification, ``Review.dists`` of
:func:`~hf_cascade.core.review.sampling_review`: the marginal output distribution of the pre-verifier's
speculative sampling, which is its own processed distribution for accepted *and* resampled tokens.
(The residual ``norm(max(0, p2 - q1))`` is only the law of a resampled token *given* that a
rejection happened; using it there while accepted tokens carry ``p2`` would be lossy.) Stop
decisions depend only on entropies of distributions fixed before the next token is drawn, so
windows of any length keep the target's distribution.

Deviations from the paper, all following the authors' code (``valexsyu/HSDDW``,
``speculative_sampling_google_hrchl_adv_dynamic_gamma_entropy``) where Algorithm 2 is looser:

* Algorithm 2 tests ``H(p_i) > tau2`` for all ``l`` positions of the pre-verifier, also those after
  a rejection (conditioned on the rejected token), and hands on all accepted tokens; we test the
  entropy of each token the pre-verifier actually emits, in order, and stop after the first one
  above ``tau2`` (the code's ``entropys_2[i] > entropy_th_2`` check; the same stop rule as Algorithm 1).
  The code then *resamples* that token from the residual, which is lossy; we keep the review's token.
* Algorithm 2 adds no token of the pre-verifier when it accepts the whole window; like the code
  (and like every review here) it adds its bonus token, which costs no extra forward.
* Algorithm 2 does not bound the accumulated window; the code verifies once it exceeds 50 tokens.
  We cap it at ``max_target_window`` (default ``5 * max_window``, i.e. 50 for the paper's K = 10).
* Drafting also stops at an end-of-sequence token and at the length budget (``max_new_tokens``).
* The target's own bonus token is transformers' verification step, as in Algorithm 1's code.
* Not in the paper: with ``lookup`` (``Policy.lookup``, the default) each target step first asks Max-Gram prompt lookup
  (:class:`~hf_cascade.drafters.maxgram.MaxGram`, its adaptive lookahead learned per ``generate()`` call)
  for a continuation of the sequence from an earlier occurrence of its suffix. When it proposes tokens,
  they are the step's draft and no draft model runs: on prompts whose answer copies the prompt
  (extraction, translation) the neural windows alone are slower than plain decoding. Lossless: lookup
  tokens are deterministic, handed to the target as point masses (``q`` one-hot), and the thresholds
  ``tau`` / ``tau2`` learn only from tokens the draft models drafted. Without ``lookup``
  (``Policy(lookup=False)``): the paper's drafter alone.
* Not in the paper: with ``cost_aware`` (``Policy.cost_aware``, the default) the draft models run on a step only
  while they are expected to pay (:class:`~hf_cascade.core.payoff.DrafterPayoff` at reach 1: their accepted tokens per
  step against the time of their forwards plus the rows their window adds to the target's step, both measured
  in this call); otherwise the step is a plain one (no draft). A refused step still drafts every 8th time, so
  the estimate keeps learning. The windows themselves stay the paper's. It decides only what is drafted:
  lossless. Without it: the draft models draft at every step the lookup leaves, as in the paper.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..candidate import Draft, SpeculativeCandidateGenerator
from ..core.categorical import categorical
from ..core.payoff import DraftPolicy
from ..core.review import Review, greedy_review, one_hot_dists, sampling_review
from ..core.stats import LevelStats
from ..drafters.maxgram import MaxGram
from ..drafters.memory import AnswerMemory
from ..drafters.neural import NeuralLevel, model_name
from ..placement import defer_reads
from .rules import EntropyThreshold, entropy, self_verify_length


@dataclass
class StageOutput:
    """What one Draft + Self-verify stage produced: ``tokens [l]``, ``dists [l, V]`` (sampling, the
    processed ``q`` each token was drawn from) and ``entropies [l]`` (``H(q_i)``, nats)."""

    tokens: torch.Tensor
    dists: torch.Tensor | None
    entropies: torch.Tensor


def draft_and_self_verify(
    level: NeuralLevel, seq: torch.Tensor, window: int, tau: float, do_sample: bool, stop_ids: set[int]
) -> StageOutput:
    """Algorithm 1 lines 3-12: draft up to ``window`` tokens after ``seq``, stopping after the first
    token whose processed distribution has entropy ``> tau`` (or after an end-of-sequence token).

    On an accelerator (:func:`~hf_cascade.placement.defer_reads`) the ``window`` tokens are drafted on the
    device and read once with their entropies, then cut by the same rule (same tokens and rows)."""
    if defer_reads(getattr(level, "device", "cpu")):
        return _draft_deferred(level, seq, window, tau, do_sample, stop_ids)
    tokens, dists, ents = [], [], []
    cur = seq
    for _ in range(window):
        scores = level.scores(cur, cur.shape[0])[-1]  # [V], processed
        q = scores.float().softmax(dim=-1)
        h = entropy(q)
        tok = (categorical(q)[None] if do_sample else scores.argmax()[None]).to(seq.device)
        tokens.append(tok)
        ents.append(h)
        if do_sample:
            dists.append(q)
        cur = torch.cat([cur, tok])
        if float(h) > tau or int(tok) in stop_ids:
            break
    return StageOutput(
        torch.cat(tokens) if tokens else seq[:0],
        torch.stack(dists).to(seq.device) if do_sample and dists else None,
        torch.stack(ents).cpu() if ents else torch.zeros(0, device="cpu"),
    )


def _draft_deferred(
    level: NeuralLevel, seq: torch.Tensor, window: int, tau: float, do_sample: bool, stop_ids: set[int]
) -> StageOutput:
    """:func:`draft_and_self_verify` with two host reads (tokens; entropies) instead of two per token."""
    tokens, _, rows = level.draft_on_device(seq, max(window, 0), do_sample)
    if not tokens:
        return StageOutput(seq[:0], None, torch.zeros(0, device="cpu"))
    ents = entropy(rows)  # [window]
    values = ents.tolist()
    n = len(tokens)
    for i, (h, tok) in enumerate(zip(values, tokens)):
        if h > tau or tok in stop_ids:
            n = i + 1
            break
    return StageOutput(
        torch.tensor(tokens[:n], dtype=torch.long, device=seq.device),
        rows[:n].to(seq.device) if do_sample else None,
        torch.tensor(values[:n], dtype=ents.dtype, device="cpu"),
    )


_NO_ENTROPIES = torch.zeros(0, device="cpu")  # no token handed to the target yet (shared: never written)


class DynamicWindowCandidateGenerator(SpeculativeCandidateGenerator):
    """One ``generate()`` call of a :class:`~hf_cascade.hsddw.DynamicWindowAssistant`."""

    def __init__(
        self,
        target,
        generation_config,
        logits_processor,
        stats,
        draft_model,
        verifier_model,
        max_window: int,
        max_target_window: int,
        tau_init: float,
        tau2_init: float,
        lookup: bool = True,
        policy: DraftPolicy | None = None,
        memory: AnswerMemory | None = None,
    ):
        super().__init__(target, generation_config, logits_processor, stats)
        self.max_window = int(max_window)
        self.max_target_window = int(max_target_window)
        small_stats = LevelStats(model_name(draft_model))
        self.small = NeuralLevel(draft_model, self.vocab_size, self.processors, small_stats)
        self.pre: NeuralLevel | None = None
        stats.levels = [small_stats]
        if verifier_model is not None:
            pre_stats = LevelStats(model_name(verifier_model))
            self.pre = NeuralLevel(verifier_model, self.vocab_size, self.processors, pre_stats)
            stats.levels = [pre_stats, small_stats]
        # Max-Gram lookup (not in the paper): its own level at the bottom, its length rule fresh per generate() call
        self.maxgram: MaxGram | None = MaxGram() if lookup else None
        self.memory = memory  # the assistant's answers of earlier calls, the lookup's other source
        # what pays (core.payoff): the lookup's length, whether the draft models' step pays (not in the paper)
        self.policy = policy if policy is not None else DraftPolicy()
        self.lookahead = self.policy.lookahead(self.maxgram) if self.maxgram is not None else None
        if self.maxgram is not None:
            stats.levels = [*stats.levels, LevelStats(self.maxgram.name)]
            stats.lookup = True
        self._lookup: tuple[int, int] | None = None  # (bucket, length) when the pending draft is the lookup's
        # Fresh thresholds per generate() call: tau is per sequence (§3.1 "in the current sentence").
        self.tau = EntropyThreshold(tau_init)
        self.tau2 = EntropyThreshold(tau2_init)
        stats.rejected_entropies = self.tau.rejected
        stats.rejected_entropies2 = self.tau2.rejected
        self._pending: torch.Tensor = _NO_ENTROPIES  # host: entropies of the q of each token handed to the target
        self._consulted: float | None = None  # seconds the draft models took for the pending draft

    def neural_levels(self) -> list[NeuralLevel]:
        return [level for level in (self.pre, self.small) if level is not None]

    def max_draft_tokens(self) -> int:
        """A hierarchical draft stops at ``max_target_window``, the lookup's at ``max_window``."""
        return max(self.max_window, self.max_target_window)

    # -- draft ---------------------------------------------------------------------------------
    def draft(self, seq: torch.Tensor, budget: int) -> Draft:
        self._lookup, self._pending, self._consulted = None, _NO_ENTROPIES, None
        if self.maxgram is not None:
            d = self._lookup_draft(seq, min(self.max_window, budget))
            if d is not None:
                return d
        if not self.policy.consult(1.0):
            self.stats.plain_steps += 1
            return Draft(seq[:0])  # the draft models would not pay here
        started = time.perf_counter()
        if self.pre is None:
            stage = self._stage(seq, min(self.max_window, budget))
            self._pending = stage.entropies
            d = Draft(stage.tokens, stage.dists)
        else:
            d = self._hierarchical(seq, min(budget, self.max_target_window))
        # the stages read their entropies on the host, so the clock reads after the device's work
        self._consulted = time.perf_counter() - started
        return d

    def _lookup_draft(self, seq: torch.Tensor, limit: int) -> Draft | None:
        """Max-Gram's proposal after ``seq`` (at most ``limit`` tokens, as many as its policy finds worth
        verifying), cut after the first stop token; ``None`` when it proposes nothing."""
        prop = self.maxgram.propose(seq, limit, self.lookahead, tokens=self.host_seq(seq), memory=self.memory)
        if prop.tokens.shape[0] == 0:
            return None
        host = prop.host if prop.host is not None else prop.tokens.tolist()  # Max-Gram proposes on the host
        cut, stop_ids = 0, self.stop_ids
        for t in host:  # up to and including the first stop token
            cut += 1
            if t in stop_ids:
                break
        tokens = prop.tokens[:cut].to(seq.device)  # no device read for the stop check
        self._lookup = (prop.bucket, int(tokens.shape[0]))
        return Draft(tokens, one_hot_dists(tokens, self.vocab_size) if self.do_sample else None, host[:cut])

    def _stage(self, seq: torch.Tensor, window: int) -> StageOutput:
        self.stats.tau_trajectory.append(self.tau.value)
        stage = draft_and_self_verify(self.small, seq, window, self.tau.value, self.do_sample, self.stop_ids)
        self.stats.draft_windows.append(int(stage.tokens.shape[0]))
        return stage

    def _hierarchical(self, seq: torch.Tensor, cap: int) -> Draft:
        """Algorithm 2: (Draft + Self-verify -> Pre-verify + Self-verify)* until the pre-verifier is unsure."""
        self.stats.tau2_trajectory.append(self.tau2.value)
        tokens, dists, ents = [seq[:0]], [], [torch.zeros(0, device="cpu")]
        total = 0
        while total < cap:
            cur = torch.cat([seq, *tokens])
            stage = self._stage(cur, min(self.max_window, cap - total))
            review, review_ents = self._pre_verify(cur, stage)
            keep = min(self_verify_length(review_ents, self.tau2.value), cap - total)
            unsure = bool((review_ents[:keep] > self.tau2.value).any())
            out = review.tokens[:keep].to(seq.device)  # the pre-verifier's device -> the target's
            stop = torch.isin(out, self._stop_tensor.to(out.device)).nonzero()
            if stop.numel():
                keep = int(stop[0]) + 1
                out = out[:keep]
            tokens.append(out)
            ents.append(review_ents[:keep])
            if review.dists is not None:
                dists.append(review.dists[:keep].to(seq.device))
            total += keep
            if unsure or stop.numel():
                break
        self._pending = torch.cat(ents)
        return Draft(torch.cat(tokens), torch.cat(dists) if self.do_sample else None)

    def _pre_verify(self, cur: torch.Tensor, stage: StageOutput) -> tuple[Review, torch.Tensor]:
        """The pre-verifier reviews the small model's window in one forward. Returns its review and
        the entropy of the distribution of each token it emits (its own processed distribution)."""
        with self.timer("pre_verify"):
            scores = self.pre.scores(torch.cat([cur, stage.tokens]), start=cur.shape[0])  # [l + 1, V]
            p = scores.float().softmax(dim=-1)
            if self.do_sample:
                review = sampling_review(stage.tokens, stage.dists, p)
            else:
                review = greedy_review(stage.tokens, scores)
        n, l = review.num_accepted, stage.tokens.shape[0]
        if n < l:
            self.tau.update(float(stage.entropies[n]))  # Algorithm 2 line 25
        _record(self.stats.levels[1], l, n)
        return review, entropy(p[: n + 1]).cpu()

    # -- update --------------------------------------------------------------------------------
    def on_target_review(self, seq, num_proposed, num_accepted, verify_seconds) -> None:
        if self.lookahead is not None and verify_seconds is not None:
            self.lookahead.cost.observe(num_proposed, verify_seconds)  # the target's verify cost, every step
        self.policy.observe_window(num_proposed, num_accepted, verify_seconds, self._consulted)
        if self._lookup is not None:
            # a lookup step: its length rule learns; tau / tau2 only learn from tokens the draft models drafted
            bucket, length = self._lookup
            self.lookahead.observe(bucket, length, min(num_accepted, length))
            _record(self.stats.levels[-1], num_proposed, num_accepted)
        else:
            if num_accepted < num_proposed:
                # Algorithm 1 line 26 / Algorithm 2 line 53: the target rejected token ``num_accepted``.
                threshold = self.tau if self.pre is None else self.tau2
                threshold.update(float(self._pending[num_accepted]))
            _record(self.stats.levels[0], num_proposed, num_accepted)
        self._lookup, self._pending, self._consulted = None, _NO_ENTROPIES, None


def _record(level: LevelStats, proposed: int, accepted: int) -> None:
    if proposed == 0:
        return
    level.proposals += 1
    level.tokens_proposed += proposed
    level.tokens_accepted += accepted
    level.acceptance_by_position.record(proposed, accepted)
