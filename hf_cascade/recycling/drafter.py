"""Token Recycling: the target's own earlier candidates, reused as a token tree (Luo et al., 2024,
"Turning Trash into Treasure: Accelerating Inference of Large Language Models with Token Recycling").

Every verification computes the target's distribution after some tokens (the root and the nodes whose
rows acceptance read). The paper keeps, for every token ``t``, the top-``k`` tokens the target proposed
the last time it ran after ``t`` (its *adjacency matrix*), and drafts by walking that matrix from the
last verified token, a static tree template of about 80 nodes, verified in one forward.

What hf_cascade keeps, and where it deviates (and why):

* the table is a host ``dict`` ``token -> (top-k tokens, their probabilities)`` filled from the rows
  the verification computed anyway (:class:`~hf_cascade.core.rows.TreeRows`: with a large vocabulary
  the output head dominates a row's cost, so no row is computed for the table alone; the paper's GPU
  has every row's logits). One top-k over those rows and one device read per step. In a batch, a step
  where no row drafted (the batch gate refused, or no lagging row had a draft) records nothing: it
  computes only what plain decoding does (:mod:`hf_cascade.core.batch`), and the table grows at drafted
  steps; at batch 1 every step records.
* it also keeps the target's *probabilities* of those candidates (the paper keeps tokens only), and the
  tree is not a fixed template: candidates are expanded best-first by path probability (the product of
  the recycled probabilities from the root, EAGLE-2's ordering) and then cut to the nodes that pay on the
  running machine (:class:`~hf_cascade.core.payoff.AdaptiveBudget`: calibrated acceptance against the
  measured verification cost), because a tree of 80 nodes costs several target forwards on a CPU.
* the sequence's own repeats join the candidates (the paper has none): the continuations of the longest
  repeated suffix, ranked by how often each followed it (SuffixDecoding's scoring,
  :mod:`~hf_cascade.drafters.continuations`), each estimated by its share of the occurrences; a repeat the
  table has not seen yet is still drafted.
* the processed distributions are recorded (temperature, top-k/top-p, penalties applied): under
  sampling the candidates are the tokens the sampler is likely to draw, under greedy the likely argmax.
* the table belongs to one ``generate()`` call by default, so a call's output (and, under sampling, its
  random stream) never depends on earlier calls. ``hot_start=True`` keeps it across the calls of one
  assistant with one target (the paper's "hot start"; SuffixDecoding's global cache does the same): the
  target's own predictions, so greedy output still equals plain ``generate`` and sampling stays exact in
  law, but a seeded sampled output then depends on what the assistant generated before.

Either way the tree is a deterministic function of the context and the past, verified with point-mass
``q`` (``None``), which :func:`~hf_cascade.core.accept.sampling_tree_accept` accepts exactly (recursive
rejection over the siblings, SpecInfer's rule for deterministic children); greedy output equals plain
``generate``.
"""

from __future__ import annotations

import torch

from ..core.accept import path_list
from ..core.payoff import DraftPolicy
from ..core.strategy import TreeDrafter, TreeStep
from ..core.structure import TokenTree
from ..drafters.continuations import SeedRates, SeedTrie, suffix_continuations
from .candidates import Expansion, RecycledCandidates, RecyclingShape


class TokenRecycling(TreeDrafter):
    """The drafter of one ``generate()`` call over a :class:`RecycledCandidates` (see the module docstring).

    ``policy``: the call's :class:`~hf_cascade.core.payoff.DraftPolicy` (which nodes pay; without its tree rule,
    or ``None``, the whole expanded tree is verified, the paper's behaviour).
    ``max_ngram``: with ``>= 1``, the continuations of the sequence's
    longest earlier suffix match join the candidates as seeds: those of its ``max_matches`` most recent
    occurrences, ranked by frequency (:func:`~hf_cascade.drafters.continuations.suffix_continuations`; with
    ``max_matches=1``, Max-Gram's one continuation).

    Each source's acceptance is learned from the target's verdicts in this call, separately (a seed token after
    a long match is accepted far more often than a recycled token of the same recycled probability): recycled
    tokens through an :class:`~hf_cascade.core.payoff.AcceptanceCalibration` of their recycled
    probability, seed tokens by :class:`~hf_cascade.drafters.continuations.SeedRates` (``rate_b * share`` per
    length ``b`` of the match)."""

    reads_rows = True  # the table records the target's rows

    @property
    def rows_top_k(self) -> int:
        """It records each row's top ``candidates.top_k`` only, so under greedy the rows may be exact at the
        outputs that can be among the top 64 (or ``top_k``) alone (the CPU backend's screen): the recorded tokens
        and their order are exact, their probabilities relative to those outputs (a little above the full
        softmax's where the tail is heavy), which the calibration of recycled probabilities against measured
        acceptance absorbs."""
        return max(64, self.candidates.top_k)

    def __init__(
        self,
        candidates: RecycledCandidates,
        shape: RecyclingShape,
        policy: DraftPolicy | None = None,
        max_ngram: int = 8,
        max_matches: int = 16,
    ):
        self.candidates, self.shape, self.max_ngram = candidates, shape, int(max_ngram)
        self.policy = policy if policy is not None else DraftPolicy(cost_aware=False)
        self.max_matches = int(max_matches)
        self.calibration = self.policy.calibration  # recycled probabilities -> the target's acceptance
        self.seed_rates = SeedRates()
        self._drafted: Expansion | None = None
        self._bucket = 0
        self._root: int | None = None  # the last draft's root (its row 0 follows it)

    def draft_tree(self, seq: torch.Tensor, state: TreeStep) -> tuple[TokenTree, None]:
        tokens_so_far = state.tokens if state.tokens is not None else seq.tolist()
        root = tokens_so_far[-1]
        depth = min(self.shape.max_depth, state.budget)
        found = Expansion([], [], [], [], [], [])
        if depth > 0:
            seeds = self._seeds(tokens_so_far, depth)
            found = self.candidates.expand(
                root, self.shape, depth, seeds, self.seed_rates.rate(self._bucket), self.calibration.frozen()
            )
        device = seq.device
        tree = TokenTree.from_host(found.tokens, found.parents, device)
        if self.policy.reads_scores and tree.num_nodes:
            keep = self.policy.keep(tree, found.estimates)
            tree = tree.select(keep)  # host bools: no read
            found = Expansion(*([v for v, k in zip(values, keep) if k] for values in found))
        self._drafted = found
        self._root = root
        return tree, None

    def _seeds(self, tokens: list[int], depth: int) -> SeedTrie:
        trie = suffix_continuations(tokens, self.max_ngram, depth, self.max_matches)
        self._bucket = SeedRates.bucket(trie.match)
        return trie

    def on_accept(self, tree: TokenTree, acceptance, state: TreeStep) -> None:
        """Record the target's rows of this verification; learn each source's acceptance; feed the budget."""
        if state.rows is not None:  # the tree the loop verified (it may prune drafts)
            self.candidates.record(state.rows, [self._root, *tree.token_list])
        path = path_list(acceptance)
        drafted = self._drafted if self._drafted is not None and len(self._drafted.tokens) == tree.num_nodes else None
        if drafted is not None:  # (a tree the loop cut at EOS or the length is not)
            on_path = set(path)
            for i, parent in enumerate(tree.parent_list):
                if parent >= 0 and parent not in on_path:
                    continue  # not reached: its parent was rejected
                if drafted.on_seed[i]:
                    self.seed_rates.observe(self._bucket, drafted.shares[i], i in on_path)
                else:
                    self.calibration.observe(drafted.probs[i], i in on_path)
        estimates = drafted.estimates if drafted is not None else []
        self.policy.observe(tree, estimates, path, len(path) + 1, state.verify_seconds, state.verify_nodes)
        self._drafted = None


__all__ = ["TokenRecycling"]
