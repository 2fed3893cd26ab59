"""``generate(..., assistant_model=SuffixAssistant())``: SuffixDecoding (Oliaro et al., 2024) over ArcticInference's
``SuffixDecodingCache`` with vLLM's defaults, a bench baseline; the drafting is :mod:`hf_cascade.suffix.drafter`'s."""

from __future__ import annotations

import itertools
from contextlib import contextmanager

from ..assistant import LinearAssistant
from ..candidate import ChainDrafter
from ..core.stats import GenerationStats
from ..core.strategy import TreeDrafter
from ..options import rejects_moved
from .drafter import SuffixCandidateGenerator, SuffixTreeDrafter
from .settings import SuffixSettings

INSTALL = "pip install arctic-inference"


def suffix_cache_class():
    """ArcticInference's ``SuffixDecodingCache`` class; ``ImportError`` naming the pip command when missing."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError as exc:
        raise ImportError(
            f"SuffixDecoding needs ArcticInference's suffix trees: {INSTALL} "
            f"(it builds a small C++ extension on install). Import failed: {exc}"
        ) from exc
    return SuffixDecodingCache


class SuffixAssistant(LinearAssistant):
    """``generate(..., assistant_model=SuffixAssistant())``: SuffixDecoding with vLLM's defaults (see
    :mod:`hf_cascade.suffix.drafter`). Greedy outputs equal plain ``generate``; sampling is lossless.

    Args:
        settings: :class:`~hf_cascade.suffix.settings.SuffixSettings` (default: vLLM's).
        cpu_kernels: the verification backend switch (see :class:`~hf_cascade.assistant.Assistant`).

    The global tree is the only state kept between calls (:attr:`cache`); :meth:`clear` empties it.
    After each call ``assistant.last_stats`` is a :class:`~hf_cascade.GenerationStats` (one level, ``suffix``).

    Example::

        import hf_cascade
        from hf_cascade.suffix import SuffixAssistant
        a = SuffixAssistant()
        out = model.generate(ids, assistant_model=a, max_new_tokens=128)
    """

    @rejects_moved(
        SuffixSettings,
        "num_speculative_tokens",
        "max_tree_depth",
        "max_cached_requests",
        "max_spec_factor",
        "min_token_prob",
        "use_tree_spec",
    )
    def __init__(self, *, settings: SuffixSettings | None = None, cpu_kernels: bool | None = None):
        self._cache_class = suffix_cache_class()
        self.settings = SuffixSettings.of(settings)
        self.trees = self.settings.use_tree_spec
        self.cpu_kernels = cpu_kernels
        self._ids = itertools.count()
        self.cache = self._new_cache()

    def _new_cache(self):
        s = self.settings
        return self._cache_class(max_tree_depth=s.max_tree_depth, max_cached_requests=s.max_cached_requests)

    def clear(self) -> None:
        """Forget every cached response (a fresh global tree)."""
        self._stop_requests()
        self.cache = self._new_cache()

    # -- requests --------------------------------------------------------------------------------------
    def _start(self, prompt: list[int]) -> int:
        request = next(self._ids)  # one request per row of the call
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

    def build(
        self, target, generation_config, logits_processor, stats, target_tokenizer=None
    ) -> SuffixCandidateGenerator:
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
            raise RuntimeError(
                "SuffixAssistant(settings=SuffixSettings(use_tree_spec=True)) drafts token trees: it "
                "runs in hf_cascade's decoding core only (loop='core')."
            )
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
        return f"SuffixAssistant(settings={self.settings})"


__all__ = ["INSTALL", "SuffixAssistant", "suffix_cache_class"]
