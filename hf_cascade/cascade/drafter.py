"""Cascade Speculative Drafting as a transformers ``CandidateGenerator`` (Chen et al., CS Drafting,
Algorithm 1).

``_cascade(reviewer, seq)`` is the paper's ``CascadeSpeculativeDraftingStep`` without its final
review: it builds the draft ``reviewer`` will check. Its loop over drafters is the *horizontal*
cascade (drafter ``j`` contributes ``K[reviewer + 1][j]`` tokens, largest drafters first); a neural
drafter with smaller drafters below it obtains its tokens by reviewing their draft (the recursive
call: the *vertical* cascade), so no neural drafter generates autoregressively unless it is the
smallest level. The target's own review is transformers' verification step, without lenience.

Every token in a draft carries the exact distribution it was drawn from (``dists``, sampling) or
its drafting level's probability (``probs``, greedy), so reviews with lenience between drafters
still hand the target a correct ``q`` (see :mod:`hf_cascade.core.accept`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..candidate import Draft, SpeculativeCandidateGenerator
from ..core.payoff import AdaptiveLookahead, DraftPolicy, ExpectedGainRule
from ..core.review import Review, greedy_review, one_hot_dists, sampling_review
from ..core.stats import LevelStats
from ..drafters.maxgram import MaxGram
from ..drafters.memory import MEMORY_BUCKETS, AnswerMemory
from ..drafters.neural import NeuralLevel, model_name

TARGET = -1  # reviewer index of the target model
MEMORY_BUCKET_SET = frozenset(MEMORY_BUCKETS.values())


@dataclass
class _Segment:
    """A run of Max-Gram tokens inside a draft, remembered for the adaptive lookahead's feedback."""

    policy: AdaptiveLookahead
    bucket: int
    start: int
    length: int


@dataclass
class _Drafted:
    """A draft under construction: ``tokens`` ``[u]`` and ``dists`` ``[u, V]`` (sampling) as tensors;
    per token, as lists (the bookkeeping reads them one by one): ``probs``, its drafting level's
    probability (float32 values), ``origin``, that level, and ``lenient``, whether reviews between
    drafters may be lenient with it; ``host``, the tokens as host ints while every one of them is known on the
    host (Max-Gram's are; a neural level's are not read for it: then ``None``)."""

    tokens: torch.Tensor
    dists: torch.Tensor | None
    probs: list[float] = field(default_factory=list)
    origin: list[int] = field(default_factory=list)
    lenient: list[bool] = field(default_factory=list)
    segments: list[_Segment] = field(default_factory=list)
    host: list[int] | None = field(default_factory=list)

    @classmethod
    def empty(cls, like: torch.Tensor, vocab_size: int, do_sample: bool) -> _Drafted:
        return cls(like[:0], torch.zeros(0, vocab_size, device=like.device) if do_sample else None)

    def __len__(self) -> int:
        return len(self.origin)

    def first(self, k: int) -> _Drafted:
        """The draft's first ``k`` tokens (itself when it has no more)."""
        if k >= len(self):
            return self
        segments = [
            _Segment(g.policy, g.bucket, g.start, min(g.length, k - g.start)) for g in self.segments if g.start < k
        ]
        return _Drafted(
            self.tokens[:k],
            None if self.dists is None else self.dists[:k],
            self.probs[:k],
            self.origin[:k],
            self.lenient[:k],
            segments,
            None if self.host is None else self.host[:k],
        )

    def append(self, tokens, probs, dists, origin: int, lenient: bool, host: list[int] | None = None) -> None:
        """Add ``tokens`` ``[u]`` with their ``probs`` ``[u]`` (a tensor, or host floats: no read) and (sampling)
        ``dists`` ``[u, V]``; ``host``: ``tokens`` as host ints, when known."""
        u = tokens.shape[0]
        tokens = tokens.to(self.tokens.device)
        self.tokens = (
            tokens if not len(self) and tokens.dtype == self.tokens.dtype else torch.cat([self.tokens, tokens])
        )
        self.probs += probs.float().cpu().tolist() if isinstance(probs, torch.Tensor) else [float(p) for p in probs]
        self.host = self.host + list(host) if self.host is not None and host is not None else None
        self.origin += [origin] * u
        self.lenient += [lenient] * u
        if self.dists is not None:
            self.dists = torch.cat([self.dists, dists.to(self.dists.device)])


class CascadeCandidateGenerator(SpeculativeCandidateGenerator):
    """One ``generate()`` call of a :class:`~hf_cascade.CascadeAssistant`."""

    def __init__(
        self,
        target,
        generation_config,
        logits_processor,
        stats,
        drafters,
        k_matrix,
        lenience: float,
        maxgram_lenience: float = 1.0,
        min_confidence: float = 0.0,
        maxgram_first: bool = False,
        keep_unsure: bool = True,
        policy: DraftPolicy | None = None,
        memory: AnswerMemory | None = None,
    ):
        super().__init__(target, generation_config, logits_processor, stats)
        self.k = k_matrix
        self.lenience = float(lenience)
        self.maxgram_lenience = float(maxgram_lenience)
        self.min_confidence = float(min_confidence)
        self.keep_unsure = bool(keep_unsure)
        # what pays (core.payoff): the smallest drafter's consultations and tokens, Max-Gram's lengths; without a
        # policy, the paper's
        self.policy = policy if policy is not None else DraftPolicy(cost_aware=False)
        # maxgram_first: Max-Gram drafts for the target directly and the smallest neural level drafts
        # after it autoregressively (no neural review of Max-Gram tokens); see CascadeAssistant.
        self.maxgram_first = bool(maxgram_first) and isinstance(drafters[-1], MaxGram) and len(drafters) > 1
        self.bottom = len(drafters) - 2 if self.maxgram_first else len(drafters) - 1
        stats.levels = [LevelStats(getattr(d, "name", None) or model_name(d)) for d in drafters]
        self.levels: list[MaxGram | NeuralLevel] = [
            d if isinstance(d, MaxGram) else NeuralLevel(d, self.vocab_size, self.processors, stats.levels[i])
            for i, d in enumerate(drafters)
        ]
        self._policies: dict[tuple[int, int], AdaptiveLookahead] = {}
        self._pending: _Drafted | None = None
        self.memory = memory  # the assistant's answers of earlier calls, Max-Gram's other source
        self.recalled: LevelStats | None = None  # the target's verdicts on memory drafts (a level after the drafters)
        if memory is not None:
            self.recalled = LevelStats("memory")
            stats.levels.append(self.recalled)

    # -- draft ---------------------------------------------------------------------------------
    def neural_levels(self) -> list[NeuralLevel]:
        return [level for level in self.levels if isinstance(level, NeuralLevel)]

    def max_draft_tokens(self) -> int:
        """The target's row of the K-matrix bounds each level's share of a draft (Max-Gram's first included)."""
        return int(sum(self.k[TARGET + 1]))

    def draft(self, seq: torch.Tensor, budget: int) -> Draft:
        d = self._cascade(TARGET, seq, budget, self.host_seq(seq))
        self._pending = d
        return Draft(d.tokens, d.dists, d.host)

    def _cascade(self, reviewer: int, seq: torch.Tensor, budget: int, tokens: list[int] | None = None) -> _Drafted:
        """Algorithm 1 up to (not including) ``reviewer``'s review: the draft ``reviewer`` will check. ``tokens``:
        ``seq`` as host ints when known (Max-Gram then reads nothing)."""
        out = _Drafted.empty(seq, self.vocab_size, self.do_sample)
        row = self.k[reviewer + 1]
        if self.maxgram_first and reviewer == TARGET and row[-1] > 0:  # Max-Gram's match goes first, unreviewed
            self._append_maxgram(out, len(self.levels) - 1, reviewer, seq, min(row[-1], budget), tokens)
        for j in range(reviewer + 1, self.bottom + 1):  # horizontal cascade
            produced, level = 0, self.levels[j]
            while produced < row[j] and len(out) < budget:
                cur = torch.cat([seq, out.tokens]) if len(out) else seq
                cur_tokens = tokens + out.host if tokens is not None and out.host is not None else None
                room = min(row[j] - produced, budget - len(out))
                if isinstance(level, MaxGram):  # statistical: all at once
                    self._append_maxgram(out, j, reviewer, cur, room, cur_tokens)
                    break
                if j == self.bottom:  # smallest level is neural
                    rule = self._expected_gain_rule(out) if reviewer == TARGET else None
                    if rule is not None and not self.policy.consult(rule.reach):
                        break  # its forwards would not pay here
                    tokens, probs, dists = self._consult(level, cur, room, rule)
                    out.append(tokens, probs, dists, origin=j, lenient=True)
                    produced += tokens.shape[0]
                    if tokens.shape[0] < room or (self.min_confidence > 0 and float(probs[-1]) < self.min_confidence):
                        break  # stopped early: unsure or a stop token
                    continue
                sub = self._cascade(j, cur, budget - len(out) - 1, cur_tokens)  # vertical cascade
                review = self._review(j, cur, sub)
                out.append(
                    review.tokens,
                    review.probs if review.probs is not None else torch.ones(len(review.tokens), device="cpu"),
                    review.dists,
                    origin=j,
                    lenient=True,
                )
                produced += review.tokens.shape[0]
                if int(review.tokens[-1]) in self.stop_ids:
                    return out
                if self.min_confidence > 0 and _confidence(review) < self.min_confidence:
                    break  # level j is unsure: stop it here
        return out

    def _expected_gain_rule(self, out: _Drafted) -> ExpectedGainRule | None:
        """The policy's rule for the smallest drafter's next target-bound tokens (``None``: the paper's, none): the
        draft so far counts with its tokens' acceptance estimates (:meth:`_acceptance`)."""
        return self.policy.token_rule(lambda: self._acceptance(out))

    def _consult(self, level: NeuralLevel, cur: torch.Tensor, room: int, rule: ExpectedGainRule | None):
        """The smallest drafter's tokens after ``cur``; with a ``rule``, its forwards' time teaches the payoff
        (the drafting loop reads each token on the host, so the clock reads after the device's work)."""
        if rule is None:
            return level.generate(cur, room, self.do_sample, self.stop_ids, self.min_confidence, self.keep_unsure)
        reach, forwards, t0 = rule.reach, level.stats.forward_calls, time.perf_counter()  # generate extends the rule
        drafted = level.generate(cur, room, self.do_sample, self.stop_ids, self.min_confidence, self.keep_unsure, rule)
        if level.stats.forward_calls > forwards:  # a consultation that ran no forward cost nothing
            self.policy.observe_consult(reach, time.perf_counter() - t0)
        return drafted

    def _acceptance(self, out: _Drafted) -> list[float]:
        """Per token of ``out``, the target's acceptance estimate once the token is reached: Max-Gram tokens
        their bucket's measured acceptance, neural tokens their probability (the smallest drafter's calibrated
        by the target's verdicts so far)."""
        calibration = self.policy.calibration
        accept = [
            calibration(p) if level == self.bottom else p  # [u] acceptance estimates
            for p, level in zip(out.probs, out.origin)
        ]
        for seg in out.segments:
            accept[seg.start : seg.start + seg.length] = [seg.policy.acceptance(seg.bucket)] * seg.length
        return accept

    def acceptance_estimates(self) -> list[float] | None:
        """The last draft's :meth:`_acceptance` (what a batch's draft gate sizes drafts by), ``None`` before one."""
        return self._acceptance(self._pending) if self._pending is not None else None

    def _append_maxgram(
        self, out: _Drafted, j: int, reviewer: int, cur: torch.Tensor, room: int, tokens: list[int] | None = None
    ) -> None:
        mg: MaxGram = self.levels[j]
        policy = self._policy(j, reviewer)
        prop = mg.propose(cur, room, policy, offset=len(out), tokens=tokens, memory=self.memory)
        u = prop.tokens.shape[0]
        if u == 0:
            return
        out.segments.append(_Segment(policy, prop.bucket, len(out), u))
        drafted = prop.tokens.to(cur.device)  # Max-Gram proposes on the host
        dists = one_hot_dists(drafted, self.vocab_size) if self.do_sample else None
        out.append(drafted, [1.0] * u, dists, origin=j, lenient=False, host=prop.host)

    def _policy(self, j: int, reviewer: int) -> AdaptiveLookahead:
        key = (j, reviewer)
        if key not in self._policies:
            self._policies[key] = self.policy.lookahead(self.levels[j])
        return self._policies[key]

    # -- review by a draft model (the target's review is transformers') ----------------------
    def _review(self, j: int, seq: torch.Tensor, sub: _Drafted) -> Review:
        """Drafter ``j`` reviews ``sub`` in one forward. ``lenience`` applies to tokens from neural
        levels; Max-Gram tokens get ``maxgram_lenience`` (default 1: none, as in CS Drafting App. B)."""
        level: NeuralLevel = self.levels[j]
        timed = isinstance(self.levels[-1], MaxGram)  # Max-Gram's lookahead learns this review's cost
        with self.timer(f"review[{j}]"):
            # the review runs on the reviewer's device: drafts move there, its output moves back in ``append``
            scores = level.scores(torch.cat([seq, sub.tokens]), start=seq.shape[0], timed=timed)  # [u + 1, V]
            lenience = torch.where(
                torch.tensor(sub.lenient, dtype=torch.bool, device="cpu"), self.lenience, self.maxgram_lenience
            )  # host values, checked there
            if self.do_sample:
                review = sampling_review(sub.tokens, sub.dists, scores.softmax(dim=-1), lenience)
            else:
                probs = torch.tensor(sub.probs, dtype=torch.float32, device=scores.device)
                review = greedy_review(sub.tokens, scores, probs, lenience)
        # a forward that also caught up on many earlier tokens (e.g. the prompt) says nothing about review cost
        seconds = level.last_forward_seconds if level.last_forward_tokens <= len(sub) + 2 else None
        self._feedback(sub, review.num_accepted, reviewer=j, seconds=seconds)
        return review

    # -- update ------------------------------------------------------------------------------
    def on_target_review(self, seq, num_proposed, num_accepted, verify_seconds) -> None:
        self.policy.observe_target(num_proposed, verify_seconds)
        if self._pending is not None:
            self._pending = self._pending.first(num_proposed)  # the target verified a prefix (a batch cuts drafts)
            self._feedback_segments(self._pending.segments, num_accepted)
            self._record_recalled(self._pending.segments, num_accepted)
            self._calibrate(self._pending, num_proposed, num_accepted)
            self.policy.observe_verdict(
                self._pending.origin[:num_accepted].count(self.bottom), num_accepted + 1, verify_seconds
            )
            self._record_acceptance(self._pending, num_accepted)
        for (_, reviewer), policy in self._policies.items():
            if reviewer == TARGET and verify_seconds is not None:
                policy.cost.observe(num_proposed, verify_seconds)
        self._pending = None

    def _calibrate(self, d: _Drafted, proposed: int, n: int) -> None:
        """The target reached the first ``n + 1`` of the ``proposed`` tokens of ``d`` and accepted ``n``:
        teach the calibration what the smallest (neural) drafter's probabilities were worth."""
        if isinstance(self.levels[self.bottom], MaxGram):
            return
        for i, level in enumerate(d.origin[: min(n + 1, proposed)]):
            if level == self.bottom:
                self.policy.calibrate(d.probs[i], i < n)

    def _feedback(self, sub: _Drafted, n: int, reviewer: int, seconds: float | None) -> None:
        self._feedback_segments(sub.segments, n)
        for (_, r), policy in self._policies.items():
            if r == reviewer and seconds is not None:
                policy.cost.observe(len(sub), seconds)
        self._record_acceptance(sub, n)

    @staticmethod
    def _feedback_segments(segments: list[_Segment], n: int) -> None:
        for seg in segments:
            if n >= seg.start:  # the segment was reached by the review
                seg.policy.observe(seg.bucket, seg.length, min(n - seg.start, seg.length))

    def _record_recalled(self, segments: list[_Segment], n: int) -> None:
        """The target accepted ``n`` tokens of a draft: count its memory segments (:attr:`recalled`)."""
        for seg in segments if self.recalled is not None else ():
            if seg.bucket in MEMORY_BUCKET_SET and n >= seg.start:  # reached by the target
                self.recalled.proposals += 1
                self.recalled.tokens_proposed += seg.length
                self.recalled.tokens_accepted += max(0, min(n - seg.start, seg.length))

    def _record_acceptance(self, d: _Drafted, n: int) -> None:
        if len(d) == 0:
            return
        for j in sorted(set(d.origin)):
            lv = self.stats.levels[j]
            lv.proposals += 1
            lv.tokens_proposed += d.origin.count(j)
            lv.tokens_accepted += d.origin[:n].count(j)
        self.stats.levels[d.origin[0]].acceptance_by_position.record(len(d), n)


def _confidence(review: Review) -> float:
    """The reviewing level's probability of the last token it output (its bonus token)."""
    if review.probs is not None:
        return float(review.probs[-1])
    return float(review.dists[-1, review.tokens[-1]])
