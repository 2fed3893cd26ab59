"""Token Recycling: the target's own earlier candidates, reused as a token tree (Luo et al., 2024,
"Turning Trash into Treasure: Accelerating Inference of Large Language Models with Token Recycling").

Every verification computes the target's distribution after some tokens (the root and the nodes whose
rows acceptance read). The paper keeps, for every token ``t``, the top-``k`` tokens the target proposed
the last time it ran after ``t`` (its *adjacency matrix*), and drafts by walking that matrix from the
last verified token, a static tree template of about 80 nodes, verified in one forward.

What this module keeps, and where it deviates (and why):

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
  running machine (:class:`~hf_cascade.core.adapt.AdaptiveBudget`: calibrated acceptance against the
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

import heapq
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..assistant import TreeAssistant
from ..core.adapt import AdaptiveBudget
from ..core.budget import VerifyCost
from ..core.accept import path_list
from ..core.strategy import TreeDrafter, TreeStep
from ..core.structure import TokenTree
from .lookahead import AcceptanceCalibration
from .continuations import SeedRates, SeedTrie, suffix_continuations


@dataclass(frozen=True)
class RecyclingShape:
    """The candidate tree before the cost cut. ``top_k``: candidates kept per token (the paper's 8);
    ``max_nodes``: most nodes expanded per step; ``max_depth``: deepest node."""

    top_k: int = 8
    max_nodes: int = 32
    max_depth: int = 8

    def __post_init__(self) -> None:
        if self.top_k < 1 or self.max_nodes < 1 or self.max_depth < 1:
            raise ValueError(f"RecyclingShape needs top_k, max_nodes and max_depth >= 1, got {self}")


class RecycledCandidates:
    """``token -> (tokens, probabilities)``: the target's top-``k`` next tokens the last time it ran after
    ``token`` (host values)."""

    def __init__(self, top_k: int = 8):
        self.top_k = int(top_k)
        self.table: dict[int, tuple[list[int], list[float]]] = {}

    def __len__(self) -> int:
        return len(self.table)

    def record(self, rows, row_tokens: list[int]) -> None:
        """Record the rows of ``rows`` (a :class:`~hf_cascade.core.rows.TreeRows`) computed already; row ``r``
        follows the token ``row_tokens[r]``. One top-k and one device read."""
        computed = sorted(r for r in rows.computed() if r < len(row_tokens))
        if not computed:
            return
        softmax = rows.softmax()                           # the view acceptance read (sampling): rows not recomputed
        probs = torch.stack([softmax[r] for r in computed])
        values, index = probs.topk(min(self.top_k, probs.shape[-1]), dim=-1)
        host = torch.stack([values.float(), index.float()]).tolist()    # one read; float32 ids exact below 2**24
        for r, vals, ids in zip(computed, host[0], host[1]):
            kept = [(int(i), v) for i, v in zip(ids, vals) if v > 0.0]
            self.table[row_tokens[r]] = ([i for i, _ in kept], [v for _, v in kept])

    def expand(self, root: int, shape: RecyclingShape, depth: int, seed: SeedTrie | list[int] | None = None,
               seed_estimate=0.5, estimate=None) -> "Expansion":
        """Best-first expansion below ``root``: at most ``shape.max_nodes`` nodes no deeper than ``depth``, in
        decreasing path estimate (parents first; each node's first child is its most probable one).

        A recycled node's estimate is ``estimate(p)`` of its recycled probability ``p`` (default: ``p``). The
        tokens of ``seed`` (continuations found elsewhere: a :class:`~hf_cascade.drafters.continuations.SeedTrie`
        below the root, or one path as a list) are estimated at the larger of ``seed_estimate(share)`` (a
        number: ``seed_estimate * share``) and that; a token both recycled and seeded is one node."""
        estimate = estimate or (lambda p: p)
        seeded = seed_estimate if callable(seed_estimate) else (lambda share: seed_estimate * share)
        trie = seed if isinstance(seed, SeedTrie) else SeedTrie.path(list(seed or []))
        out = Expansion([], [], [], [], [], [])
        heap: list[tuple] = []
        count = 0

        def push(parent: int, token: int, path: float, level: int, at: int | None) -> None:
            """The children of a node (``token`` at ``level``; ``at``: its node in ``trie``, -1 for the root,
            ``None`` off the seeds)."""
            nonlocal count
            if level >= depth:
                return
            kids, kid_probs = self.table.get(token, ((), ()))
            seeds = trie.children.get(at, []) if at is not None else []
            seeded_tokens = {t for t, _, _ in seeds}
            for child, p in zip(kids, kid_probs):
                if child not in seeded_tokens:
                    count += 1
                    e = estimate(p)
                    heapq.heappush(heap, (-path * e, count, parent, child, level, p, e, 0.0, None))
            recycled = dict(zip(kids, kid_probs)) if seeds else {}
            for child, share, node in seeds:
                p = recycled.get(child, 0.0)
                e = max(seeded(share), estimate(p))
                count += 1
                heapq.heappush(heap, (-path * e, count, parent, child, level, p, e, share, node))

        push(-1, root, 1.0, 0, -1)
        while heap and len(out.tokens) < shape.max_nodes:
            neg, _, parent, token, level, p, e, share, at = heapq.heappop(heap)
            out.tokens.append(token)
            out.parents.append(parent)
            out.probs.append(p)
            out.estimates.append(e)
            out.on_seed.append(at is not None)
            out.shares.append(share)
            push(len(out.tokens) - 1, token, -neg, level + 1, at)
        return out


class Expansion(NamedTuple):
    """A candidate tree in node order (parents first): ``tokens``, ``parents``, ``probs`` (each node's recycled
    probability after its parent's token; 0 for a seed token the table does not hold), ``estimates`` (its
    estimated acceptance, what the order used), ``on_seed`` (whether it is a seed token), ``shares`` (a seed
    token's share of its parent's occurrences; 0 off the seeds)."""

    tokens: list[int]
    parents: list[int]
    probs: list[float]
    estimates: list[float]
    on_seed: list[bool]
    shares: list[float]


class TokenRecycling(TreeDrafter):
    """The drafter of one ``generate()`` call over a :class:`RecycledCandidates` (see the module docstring).

    ``budget``: the call's :class:`~hf_cascade.core.adapt.AdaptiveBudget` (``None``: verify the whole
    expanded tree, the paper's behaviour). ``max_ngram``: with ``>= 1``, the continuations of the sequence's
    longest earlier suffix match join the candidates as seeds: those of its ``max_matches`` most recent
    occurrences, ranked by frequency (:func:`~hf_cascade.drafters.continuations.suffix_continuations`; with
    ``max_matches=1``, Max-Gram's one continuation).

    Each source's acceptance is learned from the target's verdicts in this call, separately (a seed token after
    a long match is accepted far more often than a recycled token of the same recycled probability): recycled
    tokens through an :class:`~hf_cascade.drafters.lookahead.AcceptanceCalibration` of their recycled
    probability, seed tokens by :class:`~hf_cascade.drafters.continuations.SeedRates` (``rate_b * share`` per
    length ``b`` of the match)."""

    reads_rows = True                                     # the table records the target's rows

    @property
    def rows_top_k(self) -> int:
        """It records each row's top ``candidates.top_k`` only, so under greedy the rows may be exact at the
        outputs that can be among the top 64 (or ``top_k``) alone (the CPU backend's screen): the recorded tokens
        and their order are exact, their probabilities relative to those outputs (a little above the full
        softmax's where the tail is heavy), which the calibration of recycled probabilities against measured
        acceptance absorbs."""
        return max(64, self.candidates.top_k)

    def __init__(self, candidates: RecycledCandidates, shape: RecyclingShape, budget: AdaptiveBudget | None,
                 max_ngram: int = 8, max_matches: int = 16):
        self.candidates, self.shape, self.budget, self.max_ngram = candidates, shape, budget, int(max_ngram)
        self.max_matches = int(max_matches)
        self.calibration = AcceptanceCalibration()
        self.seed_rates = SeedRates()
        self._drafted: Expansion | None = None
        self._bucket = 0
        self._root: int | None = None                      # the last draft's root (its row 0 follows it)

    def draft_tree(self, seq: torch.Tensor, state: TreeStep) -> tuple[TokenTree, None]:
        tokens_so_far = state.tokens if state.tokens is not None else seq.tolist()
        root = tokens_so_far[-1]
        depth = min(self.shape.max_depth, state.budget)
        found = Expansion([], [], [], [], [], [])
        if depth > 0:
            seeds = self._seeds(tokens_so_far, depth)
            found = self.candidates.expand(root, self.shape, depth, seeds, self.seed_rates.rate(self._bucket), self.calibration)
        device = seq.device
        tree = TokenTree(torch.tensor(found.tokens, dtype=torch.long, device=device),
                         torch.tensor(found.parents, dtype=torch.long, device=device),
                         host_parents=found.parents, host_tokens=found.tokens)
        if self.budget is not None and tree.num_nodes:
            keep = self.budget.keep(tree, found.estimates)
            tree = tree.select(keep)                                     # host bools: no read
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
        if state.rows is not None:                             # the tree the loop verified (it may prune drafts)
            self.candidates.record(state.rows, [self._root, *tree.token_list])
        path = path_list(acceptance)
        drafted = self._drafted if self._drafted is not None and len(self._drafted.tokens) == tree.num_nodes else None
        if drafted is not None:                                # (a tree the loop cut at EOS or the length is not)
            on_path = set(path)
            for i, parent in enumerate(tree.parent_list):
                if parent >= 0 and parent not in on_path:
                    continue                                   # not reached: its parent was rejected
                if drafted.on_seed[i]:
                    self.seed_rates.observe(self._bucket, drafted.shares[i], i in on_path)
                else:
                    self.calibration.observe(drafted.probs[i], i in on_path)
        if self.budget is not None:
            estimates = drafted.estimates if drafted is not None else []
            self.budget.observe_step(tree, estimates, path, len(path) + 1, state.verify_seconds, state.verify_nodes)
        self._drafted = None


class RecyclingAssistant(TreeAssistant):
    """``generate(..., assistant_model=RecyclingAssistant())``: Token Recycling, no draft model (see the module
    docstring). Greedy output equals plain ``generate``; sampling is exact.

    Args:
        top_k / max_nodes / max_depth: the candidate tree (:class:`RecyclingShape`).
        verify_cost: a :class:`~hf_cascade.core.budget.VerifyCost` (default ``VerifyCost()``: measured on the
            target's device at first use): each step verifies only the candidates that pay for their rows
            (:class:`~hf_cascade.core.adapt.AdaptiveBudget`); ``None``: the whole expanded tree.
        max_ngram / max_matches: longest suffix match whose continuations join the candidates, and how many of
            its most recent occurrences are counted (frequency-ranked; 1: Max-Gram's one continuation);
            ``max_ngram=0``: none (the paper's table alone).
        hot_start: keep the recycled candidates across the calls of this assistant with one target (see the
            module docstring; a different target, or :meth:`reset`, starts an empty table). Default: one
            table per call.
        cpu_kernels: see :mod:`hf_cascade.backends`.

    Example::

        from hf_cascade.drafters.recycling import RecyclingAssistant
        out = model.generate(ids, assistant_model=RecyclingAssistant(), do_sample=True, temperature=0.7)
    """

    def __init__(self, top_k: int = 8, max_nodes: int = 32, max_depth: int = 8,
                 max_ngram: int = 8, max_matches: int = 16, verify_cost: VerifyCost | None = VerifyCost(),
                 hot_start: bool = False, cpu_kernels: bool | None = None):
        if verify_cost is not None and not isinstance(verify_cost, VerifyCost):
            raise TypeError(f"verify_cost must be a hf_cascade.core.budget.VerifyCost or None, got {type(verify_cost).__name__}")
        self.shape = RecyclingShape(int(top_k), int(max_nodes), int(max_depth))
        self.max_ngram, self.max_matches = int(max_ngram), int(max_matches)
        self.verify_cost = verify_cost
        self.hot_start = bool(hot_start)
        self.cpu_kernels = cpu_kernels
        self.reset()

    def reset(self) -> None:
        """Forget every recycled candidate."""
        self.candidates = RecycledCandidates(self.shape.top_k)
        self._owner: tuple | None = None

    def new_drafter(self, target, generation_config, logits_processor, stats=None, target_tokenizer=None) -> TokenRecycling:
        config = target.config.get_text_config()
        if int(config.vocab_size) > 2 ** 24:
            raise ValueError(f"RecyclingAssistant reads token ids as float32 (exact below 2**24); this target's "
                             f"vocabulary has {config.vocab_size} tokens")
        owner = (id(target), getattr(target.config, "_name_or_path", None), int(config.vocab_size))
        if owner != self._owner or not self.hot_start:    # another target's candidates are not this one's
            self.reset()
            self._owner = owner
        budget = AdaptiveBudget(self.verify_cost.resolve(target)) if self.verify_cost is not None else None
        return TokenRecycling(self.candidates, self.shape, budget, self.max_ngram, self.max_matches)


__all__ = ["RecycledCandidates", "RecyclingAssistant", "RecyclingShape", "TokenRecycling"]
