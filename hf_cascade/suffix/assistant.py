"""``generate(..., assistant_model=SuffixAssistant())``: SuffixDecoding (Oliaro et al., 2024) over ArcticInference's
``SuffixDecodingCache`` with vLLM's defaults, a bench baseline; the drafting is :mod:`hf_cascade.suffix.drafter`'s."""

from __future__ import annotations

import itertools
from contextlib import contextmanager

from ..assistant import LinearAssistant
from ..candidate import ChainDrafter
from ..core.stats import GenerationStats
from ..core.strategy import TreeDrafter
from .drafter import SuffixCandidateGenerator, SuffixTreeDrafter

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


class SuffixAssistant(LinearAssistant):
    """``generate(..., assistant_model=SuffixAssistant())``: SuffixDecoding with vLLM's defaults (see
    :mod:`hf_cascade.suffix.drafter`). Greedy outputs equal plain ``generate``; sampling is lossless.

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
        from hf_cascade.suffix import SuffixAssistant
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


__all__ = ["INSTALL", "SuffixAssistant", "VLLM_DEFAULTS", "suffix_cache_class"]
