"""SuffixDecoding (Oliaro et al., 2024, arXiv:2411.04975): the drafters of one ``generate()`` call over the cache.

The suffix trees are the reference implementation's: ArcticInference's ``SuffixDecodingCache``
(``pip install arctic-inference``, imported only when a :class:`~hf_cascade.suffix.SuffixAssistant` is built).
This module drives that cache the way vLLM's suffix-decoding proposer does, with vLLM's defaults
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

import torch

from ..candidate import Draft, SpeculativeCandidateGenerator
from ..core.accept import TreeAcceptance
from ..core.review import one_hot_dists
from ..core.stats import GenerationStats, LevelStats
from ..core.strategy import TreeDrafter, TreeStep
from ..core.structure import TokenTree


class _Request:
    """One ``generate()`` call as one request of the assistant's cache (``assistant``: the
    :class:`~hf_cascade.suffix.SuffixAssistant`): started at the first draft (the sequence then is the prompt),
    given every token emitted after it, stopped by the assistant."""

    def __init__(self, assistant):
        self.assistant = assistant
        self.id: int | None = None
        self.known = 0  # tokens of the sequence the cache holds (prompt + response)

    def speculate(self, seq: torch.Tensor, max_tokens: int, tree: bool):
        """The cache's draft after ``seq`` (``[L]``), at most ``max_tokens`` tokens."""
        a = self.assistant
        if self.id is None:
            self.id = a._start(seq.tolist())
            self.known = seq.shape[0]
        else:
            self.sync(seq)
        context = seq[-a.settings.max_tree_depth :].tolist()
        return a.cache.speculate(
            self.id,
            context,
            max_spec_tokens=max_tokens,
            max_spec_factor=a.settings.max_spec_factor,
            min_token_prob=a.settings.min_token_prob,
            use_tree_spec=tree,
        )

    def sync(self, seq: torch.Tensor) -> None:
        """Append the tokens of ``seq`` the cache has not seen to the request's response."""
        if self.id is not None and seq.shape[0] > self.known:
            self.assistant.cache.add_active_response(self.id, seq[self.known :].tolist())
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

    def __init__(self, target, generation_config, logits_processor, stats, assistant):
        super().__init__(target, generation_config, logits_processor, stats)
        self.request = _Request(assistant)
        self.max_tokens = assistant.settings.num_speculative_tokens
        self.level = _level(stats)

    def max_draft_tokens(self) -> int:
        return self.max_tokens

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

    def __init__(self, assistant, stats: GenerationStats):
        self.request = _Request(assistant)
        self.max_tokens = assistant.settings.num_speculative_tokens
        self.level = _level(stats)

    def draft_tree(self, seq: torch.Tensor, state: TreeStep) -> tuple[TokenTree, None]:
        if state.budget <= 0:
            return TokenTree.empty(seq.device), None
        d = self.request.speculate(seq, self.max_tokens, tree=True)  # the core prunes it to the budget
        tokens, parents = list(d.token_ids), list(d.parents)
        tree = TokenTree.from_host(tokens, parents, seq.device)
        return tree, None

    def on_accept(self, tree: TokenTree, acceptance: TreeAcceptance, state: TreeStep) -> None:
        self.request.sync(state.seq)
        _record(self.level, tree.num_nodes, len(acceptance.path))


__all__ = ["SuffixCandidateGenerator", "SuffixTreeDrafter"]
