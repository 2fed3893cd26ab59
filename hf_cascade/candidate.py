"""Linear strategies: a ``CandidateGenerator`` that runs in the decoding core and in transformers' loop.

A linear strategy (the cascade, HSDDW) implements :meth:`SpeculativeCandidateGenerator.draft` and
:meth:`~SpeculativeCandidateGenerator.on_target_review` once. :class:`ChainDrafter` runs it in the
decoding core (:func:`~hf_cascade.core.loop.speculative_decode`, the default) as a draft with one path;
the same object is also a transformers ``CandidateGenerator``, so ``assistant.loop = "transformers"``
runs it in transformers' own ``_assisted_decoding``, which runs, per step (numbered as in its source):

1. ``candidate_generator.get_candidates(input_ids)``  -> our **draft**
2. one target forward over the candidates             -> **verify**
3. greedy match or speculative sampling               -> **accept** (``_speculative_sampling``)
4. cache crop + ``update_candidate_strategy``         -> our **update**

:class:`SpeculativeCandidateGenerator` implements 1 and 4 around a strategy's :meth:`draft` and
:meth:`on_target_review`. The draft is handed over with ``candidate_logits = log q``: ``q`` is
exactly the processed distribution each draft token was drawn from, so transformers' speculative
sampling (Leviathan et al., Algorithm 1) stays lossless. Under greedy decoding no ``q`` is needed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel
from transformers.generation.candidate_generator import CandidateGenerator

from .core.accept import TreeAcceptance
from .core.stats import GenerationStats, PhaseTimer
from .core.stopping import stop_token_ids
from .core.strategy import TreeDrafter, TreeStep
from .core.structure import TokenTree
from .drafters.neural import output_vocab_size
from .processors import split_processors


@dataclass
class Draft:
    """A draft for the target. ``tokens``: ``[k]``; ``dists``: ``[k, V]`` (sampling) or ``None``; ``host_tokens``:
    ``tokens`` as host ints when the strategy drafted them on the host (the core then reads nothing of them)."""

    tokens: torch.Tensor
    dists: torch.Tensor | None = None
    host_tokens: list[int] | None = None


class SpeculativeCandidateGenerator(CandidateGenerator):
    """Shared skeleton: budget, EOS cut, draft-aware processors, statistics, timing.

    Subclasses implement :meth:`draft` (tokens after ``seq``) and :meth:`on_target_review`.
    One instance lives for exactly one ``generate()`` call, so no state leaks between calls.
    """

    def __init__(
        self,
        target: PreTrainedModel,
        generation_config: GenerationConfig,
        logits_processor: LogitsProcessorList | None,
        stats: GenerationStats,
    ):
        self.target = target
        self.do_sample = bool(generation_config.do_sample)
        self.max_length = int(generation_config.max_length)
        # the longest sequence a static cache of this call holds (compiled drafter forwards size theirs by it)
        self.max_cache_len = max(getattr(generation_config, "max_cache_len", None) or 0, self.max_length)
        self.vocab_size = output_vocab_size(target)
        self.processors, self.target_rules = split_processors(logits_processor)
        self.stop_ids, stop_tensor = stop_token_ids(generation_config)
        self._stop_tensor = stop_tensor if stop_tensor is not None else torch.zeros(0, dtype=torch.long)
        self.stats = stats
        self.timer = PhaseTimer(stats, target)
        self._last_draft_len = 0
        self._verify_started: float | None = None
        self._host_seq: list[int] | None = None  # the sequence as host ints, during a draft from the core

    def host_seq(self, seq: torch.Tensor) -> list[int] | None:
        """``seq`` as host ints when the caller handed them over (the decoding core does, during :meth:`draft`:
        no device read), else ``None``."""
        tokens = self._host_seq
        return tokens if tokens is not None and len(tokens) == seq.shape[0] else None

    # -- to implement -------------------------------------------------------------------------
    def draft(self, seq: torch.Tensor, budget: int) -> Draft:
        """At most ``budget`` draft tokens to follow ``seq`` (``[L]``)."""
        raise NotImplementedError

    def on_target_review(
        self, seq: torch.Tensor, num_proposed: int, num_accepted: int, verify_seconds: float | None
    ) -> None:
        """Feedback after the target reviewed the last draft (``seq`` now includes its output).
        ``verify_seconds`` is ``None`` for the first call, whose time is dominated by the prompt's prefill."""

    def max_draft_tokens(self) -> int:
        """The most tokens one :meth:`draft` proposes. Default: the call's whole length (a draft never exceeds the
        budget left); strategies with a fixed cap give it."""
        return self.max_length

    @property
    def num_drafting_tokens(self) -> int:
        """transformers' ``CandidateGenerator`` contract since 5.25: ``_assisted_decoding`` reads it before its first
        step (``cache.activate_past_recording(recurrent_states_to_keep=...)``: a cache with linear-attention layers
        keeps that many recurrent states to roll a rejected draft back). An upper bound is correct: it is
        :meth:`max_draft_tokens`."""
        return self.max_draft_tokens()

    def neural_levels(self) -> list:
        """The :class:`~hf_cascade.drafters.neural.NeuralLevel` s this generator drafts with (default: none)."""
        return []

    def compile_forwards(self, compile_config) -> None:
        """This call's verification runs compiled (:func:`~hf_cascade.core.compiled.call_compiles`): so do the
        forwards of its drafter models (:meth:`neural_levels`), over static caches as long as the target's."""
        for level in self.neural_levels():
            level.compile_forwards(compile_config, self.max_cache_len)

    # -- transformers' CandidateGenerator contract --------------------------------------------
    def get_candidates(
        self, input_ids: torch.LongTensor, **kwargs
    ) -> tuple[torch.LongTensor, torch.FloatTensor | None]:
        """1. Draft. Returns ``([1, L + k] candidates, [1, k, V] log q or None)``."""
        if input_ids.shape[0] != 1:
            raise ValueError("hf_cascade assistants support batch size 1 only.")
        seq = input_ids[0]
        budget = self.max_length - seq.shape[0] - 1
        with self.timer("draft"):
            d = self.draft(seq, budget) if budget > 0 else Draft(seq[:0])
            d = self._cut_after_stop(d)
        k = d.tokens.shape[0]
        self._last_draft_len = k
        candidates = torch.cat([seq, d.tokens.to(seq.device)])[None]
        for rule in self.target_rules:
            rule.set_candidates(candidates)
        logits = None
        if self.do_sample and k > 0:
            logits = d.dists.to(input_ids.device).clamp_min(0).log()[None]  # [1, k, V]
        self._verify_started = time.perf_counter()
        return candidates, logits

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, num_matches: int):
        """4. Update: statistics and the strategy's feedback."""
        verify_seconds = time.perf_counter() - self._verify_started if self._verify_started else 0.0
        self.stats.phase_seconds["verify"] += verify_seconds
        n = int(num_matches)
        self.stats.record_target_review(self._last_draft_len, n)
        for rule in self.target_rules:
            rule.set_candidates(None)
        first = self.stats.target_calls == 1
        with self.timer("update"):
            self.on_target_review(input_ids[0], self._last_draft_len, n, None if first else verify_seconds)

    def _cut_after_stop(self, d: Draft) -> Draft:
        """Nothing after an EOS token can be accepted: do not make the target verify it."""
        if not self.stop_ids or d.tokens.numel() == 0:
            return d
        hits = torch.isin(d.tokens, self._stop_tensor.to(d.tokens.device)).nonzero()
        if hits.numel() == 0:
            return d
        end = int(hits[0]) + 1
        return Draft(d.tokens[:end], None if d.dists is None else d.dists[:end])


class ChainDrafter(TreeDrafter):
    """A linear strategy's drafts in the decoding core: each draft is a chain (a tree with one path),
    verified without a tree mask; the core's statistics and the generator's own feedback as in
    transformers' loop (``on_target_review`` with the measured verification time)."""

    linear = True

    def __init__(self, generator: SpeculativeCandidateGenerator):
        self.generator = generator

    def draft_tree(self, seq: torch.Tensor, state: TreeStep) -> tuple[TokenTree, torch.Tensor | None]:
        if state.budget <= 0:
            return TokenTree.chain(seq[:0], host_tokens=()), None
        self.generator._host_seq = state.tokens  # the loop's host copy of seq: no read to draft
        try:
            d = self.generator.draft(seq, state.budget)
        finally:
            self.generator._host_seq = None
        return TokenTree.chain(d.tokens, host_tokens=d.host_tokens), (d.dists if self.generator.do_sample else None)

    def compile_forwards(self, compile_config) -> None:
        self.generator.compile_forwards(compile_config)

    def reach(self, tree: TokenTree) -> list[float] | None:
        """``P(at least k accepted)``: the products of the generator's per-token acceptance estimates, where it
        gives them (``acceptance_estimates``)."""
        estimates = getattr(self.generator, "acceptance_estimates", None)
        if estimates is None:
            return None
        if tree.num_nodes == 0:
            return []
        accept = estimates()
        if accept is None or len(accept) < tree.num_nodes:
            return None
        out, p = [], 1.0
        for a in accept[: tree.num_nodes]:
            p *= a
            out.append(p)
        return out

    def on_accept(self, tree: TokenTree, acceptance: TreeAcceptance, state: TreeStep) -> None:
        # In a batch the step's time is that of the widest row's draft: it tells this row's cost model what its
        # own draft length costs only when that was its own (otherwise a row that drafted nothing beside a row
        # that drafted much would learn that drafting nothing is slow).
        own = state.verify_nodes is None or state.verify_nodes == tree.num_nodes
        self.generator.on_target_review(
            state.seq, tree.num_nodes, len(acceptance.path), state.verify_seconds if own else None
        )
