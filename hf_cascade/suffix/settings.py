"""SuffixDecoding's settings (:class:`SuffixSettings`): vLLM's defaults, apart from the drafter that runs them."""

from __future__ import annotations

from dataclasses import dataclass

from ..options import Options


@dataclass(frozen=True)
class SuffixSettings(Options):
    """SuffixDecoding's settings (Oliaro et al., 2024); the defaults are vLLM's (``SpeculativeConfig``:
    suffix_decoding_max_tree_depth, _max_cached_requests, _max_spec_factor, _min_token_prob; its docs'
    num_speculative_tokens for suffix decoding).

    Attributes:
        num_speculative_tokens: most draft tokens per step (vLLM: 32).
        max_tree_depth: depth of the suffix trees; bounds match length plus draft length (vLLM: 24).
        max_cached_requests: responses kept in the global tree, FIFO (vLLM: 10000; 0: no global tree, each call then
            drafts from its own prompt and response only; -1: no limit).
        max_spec_factor: a draft has at most ``max_spec_factor`` x the match length tokens (vLLM: 1.0).
        min_token_prob: lowest frequency-estimated probability of a drafted token (vLLM: 0.1).
        use_tree_spec: draft the cache's speculation trees (core only) instead of its best path (vLLM: False).
    """

    num_speculative_tokens: int = 32
    max_tree_depth: int = 24
    max_cached_requests: int = 10000
    max_spec_factor: float = 1.0
    min_token_prob: float = 0.1
    use_tree_spec: bool = False

    def __post_init__(self) -> None:
        if self.num_speculative_tokens < 1 or self.max_tree_depth < 1:
            raise ValueError(
                f"SuffixDecoding needs num_speculative_tokens >= 1 and max_tree_depth >= 1, got "
                f"{self.num_speculative_tokens}, {self.max_tree_depth}."
            )
        if self.max_spec_factor <= 0 or not 0.0 <= self.min_token_prob <= 1.0 or self.max_cached_requests < -1:
            raise ValueError(
                f"SuffixDecoding needs max_spec_factor > 0, min_token_prob in [0, 1] and "
                f"max_cached_requests >= -1, got {self.max_spec_factor}, {self.min_token_prob}, "
                f"{self.max_cached_requests}."
            )
        self._normalize(
            num_speculative_tokens=int,
            max_tree_depth=int,
            max_cached_requests=int,
            max_spec_factor=float,
            min_token_prob=float,
            use_tree_spec=bool,
        )


__all__ = ["SuffixSettings"]
