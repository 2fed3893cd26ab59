"""SuffixDecoding (Oliaro et al., 2024, arXiv:2411.04975) as an hf_cascade assistant, a bench baseline.

The suffix trees are the reference implementation's: ArcticInference's ``SuffixDecodingCache``
(``pip install arctic-inference``, imported only when a :class:`SuffixAssistant` is built). This module
drives that cache the way vLLM's suffix-decoding proposer does, with vLLM's defaults
(``SpeculativeConfig.suffix_decoding_*``), and verifies in hf_cascade's decoding core, so the
verification (its CPU kernels included) is exactly the one Max-Gram gets:

* one cache per assistant, ``SuffixDecodingCache(max_tree_depth=24, max_cached_requests=10000)``; its
  *global* tree holds the responses of earlier requests (FIFO eviction past ``max_cached_requests``; 0
  disables it). An assistant reused across prompts grows it, as vLLM does across requests;
* each ``generate()`` call is a new request (a fresh id): at its first draft, ``start_request(id, prompt)``
  builds the prompt's own tree; after every verification the emitted tokens go to
  ``add_active_response`` (the request's tree and its response in the global tree); at the end of the
  call, also when it raised, ``stop_request`` drops the prompt's tree and the response stays cached;
* each draft is ``speculate(id, context, max_spec_tokens=min(32, budget), max_spec_factor=1.0,
  min_token_prob=0.1)`` on the last ``max_tree_depth`` tokens: the cache matches the context's suffix in
  the prompt's tree and in the global tree and keeps the higher-scoring continuation (score: the sum of
  its tokens' frequency estimates; at most ``max_spec_factor`` x the match length tokens, each estimated
  at ``>= min_token_prob``). Tree depth 24 bounds match plus speculation, so with factor 1.0 a draft has
  at most 12 tokens: the 32 (vLLM's documented ``num_speculative_tokens``) does not bind at depth 24.
* drafts are linear (``use_tree_spec=False``: what vLLM runs), verified as a chain. ``use_tree_spec=True``
  asks the cache for its speculation tree (the paper's tree speculation) and verifies it as a token tree
  in the core (:class:`~hf_cascade.core.structure.TokenTree`; core only, not transformers' loop). Its node
  budget is the same ``max_spec_factor`` x match length, so at factor 1.0 the trees seldom branch.

Deviations, and why:

* the first draft of a call follows the last prompt token (the core drafts before the target emitted
  anything); vLLM's first proposal follows the prefill's first sampled token. Same rule, one draft more.
* the draft is a deterministic function of the context and the cache, so under sampling its ``q`` is
  a point mass (one-hot, as Max-Gram's; ``None`` for trees): lossless, as the core's acceptance is
  exact for any ``q``. vLLM's rejection sampler treats suffix drafts the same way.
* one ``generate()`` at a time per assistant: starting a request stops any request this assistant left
  open (e.g. transformers' loop interrupted outside its session).
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager

import torch

from ..assistant import LinearAssistant
from ..candidate import ChainDrafter, Draft, SpeculativeCandidateGenerator
from ..core.accept import TreeAcceptance
from ..core.review import one_hot_dists
from ..core.stats import GenerationStats, LevelStats
from ..core.strategy import TreeDrafter, TreeStep
from ..core.structure import TokenTree

INSTALL = "pip install arctic-inference"

#: vLLM's defaults (``SpeculativeConfig``: suffix_decoding_max_tree_depth, _max_cached_requests,
#: _max_spec_factor, _min_token_prob; its docs' num_speculative_tokens for suffix decoding)
VLLM_DEFAULTS = {"num_speculative_tokens": 32, "max_tree_depth": 24, "max_cached_requests": 10000,
                 "max_spec_factor": 1.0, "min_token_prob": 0.1}


def suffix_cache_class():
    """ArcticInference's ``SuffixDecodingCache`` class; ``ImportError`` naming the pip command when missing."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError as exc:
        raise ImportError(f"SuffixDecoding needs ArcticInference's suffix trees: {INSTALL} "
                          f"(it builds a small C++ extension on install). Import failed: {exc}") from exc
    return SuffixDecodingCache


class _Request:
    """One ``generate()`` call as one request of the assistant's cache: started at the first draft (the
    sequence then is the prompt), given every token emitted after it, stopped by the assistant."""

    def __init__(self, assistant: "SuffixAssistant"):
        self.assistant = assistant
        self.id: int | None = None
        self.known = 0                          # tokens of the sequence the cache holds (prompt + response)

    def speculate(self, seq: torch.Tensor, max_tokens: int, tree: bool):
        """The cache's draft after ``seq`` (``[L]``), at most ``max_tokens`` tokens."""
        a = self.assistant
        if self.id is None:
            self.id = a._start(seq.tolist())
            self.known = seq.shape[0]
        else:
            self.sync(seq)
        context = seq[-a.max_tree_depth:].tolist()
        return a.cache.speculate(self.id, context, max_spec_tokens=max_tokens, max_spec_factor=a.max_spec_factor,
                                 min_token_prob=a.min_token_prob, use_tree_spec=tree)

    def sync(self, seq: torch.Tensor) -> None:
        """Append the tokens of ``seq`` the cache has not seen to the request's response."""
        if self.id is not None and seq.shape[0] > self.known:
            self.assistant.cache.add_active_response(self.id, seq[self.known:].tolist())
            self.known = seq.shape[0]


def _level(stats: GenerationStats) -> LevelStats:
    stats.levels = [LevelStats("suffix")]
    return stats.levels[0]


def _record(level: LevelStats, proposed: int, accepted: int) -> None:
    if proposed:
        level.proposals += 1
        level.tokens_proposed += proposed
        level.tokens_accepted += accepted
        level.acceptance_by_position.record(proposed, accepted)


class SuffixCandidateGenerator(SpeculativeCandidateGenerator):
    """Linear suffix drafts for one ``generate()`` call (the core's chain, or transformers' loop)."""

    def __init__(self, target, generation_config, logits_processor, stats, assistant: "SuffixAssistant"):
        super().__init__(target, generation_config, logits_processor, stats)
        self.request = _Request(assistant)
        self.max_tokens = assistant.num_speculative_tokens
        self.level = _level(stats)

    def draft(self, seq: torch.Tensor, budget: int) -> Draft:
        d = self.request.speculate(seq, min(self.max_tokens, budget), tree=False)
        tokens = torch.tensor(d.token_ids, dtype=seq.dtype, device=seq.device)
        return Draft(tokens, one_hot_dists(tokens, self.vocab_size) if self.do_sample else None)

    def on_target_review(self, seq, num_proposed, num_accepted, verify_seconds) -> None:
        self.request.sync(seq)
        _record(self.level, num_proposed, num_accepted)


class SuffixTreeDrafter(TreeDrafter):
    """The cache's speculation trees (``use_tree_spec=True``) for one ``generate()`` call, in the core."""

    linear = False

    def __init__(self, assistant: "SuffixAssistant", stats: GenerationStats):
        self.request = _Request(assistant)
        self.max_tokens = assistant.num_speculative_tokens
        self.level = _level(stats)

    def draft_tree(self, seq: torch.Tensor, state: TreeStep) -> tuple[TokenTree, None]:
        if state.budget <= 0:
            return TokenTree(seq.new_zeros(0), seq.new_zeros(0)), None
        d = self.request.speculate(seq, self.max_tokens, tree=True)        # the core prunes it to the budget
        tokens, parents = list(d.token_ids), list(d.parents)
        tree = TokenTree(torch.tensor(tokens, dtype=torch.long, device=seq.device),
                         torch.tensor(parents, dtype=torch.long, device=seq.device),
                         host_parents=parents, host_tokens=tokens)
        return tree, None

    def on_accept(self, tree: TokenTree, acceptance: TreeAcceptance, state: TreeStep) -> None:
        self.request.sync(state.seq)
        _record(self.level, tree.num_nodes, len(acceptance.path))


class SuffixAssistant(LinearAssistant):
    """``generate(..., assistant_model=SuffixAssistant())``: SuffixDecoding with vLLM's defaults (see the
    module docstring). Greedy outputs equal plain ``generate``; sampling is lossless.

    Args:
        num_speculative_tokens: most draft tokens per step (vLLM: 32).
        max_tree_depth: depth of the suffix trees; bounds match length plus draft length (vLLM: 24).
        max_cached_requests: responses kept in the global tree, FIFO (vLLM: 10000; 0: no global tree,
            each call then drafts from its own prompt and response only; -1: no limit).
        max_spec_factor: a draft has at most ``max_spec_factor`` x the match length tokens (vLLM: 1.0).
        min_token_prob: lowest frequency-estimated probability of a drafted token (vLLM: 0.1).
        use_tree_spec: draft the cache's speculation trees (core only) instead of its best path (vLLM: False).
        cpu_kernels: the verification backend switch (see :class:`~hf_cascade.assistant.Assistant`).

    The global tree is the only state kept between calls (:attr:`cache`); :meth:`clear` empties it.
    After each call ``assistant.last_stats`` is a :class:`~hf_cascade.GenerationStats` (one level, ``suffix``).

    Example::

        import hf_cascade
        from hf_cascade.drafters.suffix import SuffixAssistant
        a = SuffixAssistant()
        out = model.generate(ids, assistant_model=a, max_new_tokens=128)
    """

    def __init__(self, num_speculative_tokens: int = 32, max_tree_depth: int = 24, max_cached_requests: int = 10000,
                 max_spec_factor: float = 1.0, min_token_prob: float = 0.1, use_tree_spec: bool = False,
                 cpu_kernels: bool | None = None):
        self._cache_class = suffix_cache_class()
        if num_speculative_tokens < 1 or max_tree_depth < 1:
            raise ValueError(f"SuffixAssistant needs num_speculative_tokens >= 1 and max_tree_depth >= 1, got "
                             f"{num_speculative_tokens}, {max_tree_depth}.")
        if max_spec_factor <= 0 or not 0.0 <= min_token_prob <= 1.0 or max_cached_requests < -1:
            raise ValueError(f"SuffixAssistant needs max_spec_factor > 0, min_token_prob in [0, 1] and "
                             f"max_cached_requests >= -1, got {max_spec_factor}, {min_token_prob}, {max_cached_requests}.")
        self.num_speculative_tokens = int(num_speculative_tokens)
        self.max_tree_depth = int(max_tree_depth)
        self.max_cached_requests = int(max_cached_requests)
        self.max_spec_factor = float(max_spec_factor)
        self.min_token_prob = float(min_token_prob)
        self.trees = bool(use_tree_spec)
        self.cpu_kernels = cpu_kernels
        self._ids = itertools.count()
        self.cache = self._new_cache()

    def _new_cache(self):
        return self._cache_class(max_tree_depth=self.max_tree_depth, max_cached_requests=self.max_cached_requests)

    def clear(self) -> None:
        """Forget every cached response (a fresh global tree)."""
        self._stop_requests()
        self.cache = self._new_cache()

    # -- requests --------------------------------------------------------------------------------------
    def _start(self, prompt: list[int]) -> int:
        request = next(self._ids)                               # one request per row of the call
        self.cache.start_request(request, prompt)
        return request

    def _stop_requests(self) -> None:
        for request in list(self.cache.active_requests):
            self.cache.stop_request(request)

    # -- the assistant contract ------------------------------------------------------------------------
    def bind(self, target) -> None:
        """A new call: requests a failed call left active are stopped (one ``generate()`` at a time)."""
        super().bind(target)
        self._stop_requests()

    def build(self, target, generation_config, logits_processor, stats, target_tokenizer=None) -> SuffixCandidateGenerator:
        return SuffixCandidateGenerator(target, generation_config, logits_processor, stats, self)

    def new_drafter(self, target, generation_config, logits_processor, stats, target_tokenizer=None) -> TreeDrafter:
        if self.trees:
            return SuffixTreeDrafter(self, stats)
        return ChainDrafter(self.build(target, generation_config, logits_processor, stats, target_tokenizer))

    def finish(self, drafter, stats: GenerationStats) -> GenerationStats:
        """End of a core call (also after an exception): stop the request, keep its response."""
        self._stop_requests()
        return stats

    def candidate_generator(self, *args, **kwargs) -> SuffixCandidateGenerator:
        if self.trees:
            raise RuntimeError("SuffixAssistant(use_tree_spec=True) drafts token trees: it runs in hf_cascade's "
                               "decoding core only (loop='core').")
        return super().candidate_generator(*args, **kwargs)

    @contextmanager
    def target_session(self, target):
        """transformers' loop (``loop = "transformers"``): the backend, and the request stopped at its end."""
        try:
            with super().target_session(target) as session:
                yield session
        finally:
            self._stop_requests()

    def __repr__(self) -> str:
        return (f"SuffixAssistant(num_speculative_tokens={self.num_speculative_tokens}, max_tree_depth={self.max_tree_depth}, "
                f"max_cached_requests={self.max_cached_requests}, max_spec_factor={self.max_spec_factor}, "
                f"min_token_prob={self.min_token_prob}, use_tree_spec={self.trees})")
