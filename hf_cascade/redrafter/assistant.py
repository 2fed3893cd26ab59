"""``generate(..., assistant_model=ReDrafterAssistant(head))``: ReDrafter decoding on the tree loop.

Cheng et al. (2024), "Recurrent Drafter for Fast Speculative Decoding in Large Language Models",
Section 2 ("Speculative decoding with ReDrafter"). Each step, draft -> verify -> accept -> update:

1. **Draft** (:class:`ReDrafterDrafter`): the target's last hidden state ``x`` (handed over by the
   tree loop as :attr:`TreeStep.last_hidden`, captured during the previous target pass: no extra
   target forward) and the token the target produced from it (the root, ``seq[-1]``) start a beam
   search with the recurrent head (:func:`~hf_cascade.redrafter.beam.beam_search`): ``w`` beams of
   ``L`` draft tokens.
2. **Pack**: the beams' shared prefixes are deduplicated with tensor ops
   (:func:`~hf_cascade.core.structure.get_prefix_match`, Listing 1) into a token tree
   (:meth:`TokenTree.from_beams`: dynamic tree attention). ``dedupe=False`` verifies the ``w * L``
   beam tokens flat instead, each beam its own branch (the paper's "w/o tree attention" baseline).
3. **Verify and accept** (:func:`~hf_cascade.core.loop.speculative_decode`): one target forward over the
   tree with its tree mask; greedy: the longest path the target agrees with (= the candidate with
   the longest accepted prefix); sampling: recursive rejection sampling with point-mass drafts
   (the tree is a deterministic function of the context), exactly the target's distribution.
4. **Update**: only the accepted path stays in the target's KV cache; the hidden state that produced
   the last emitted token is the next step's ``x``.

When the prompt has a single token there is no ``x`` yet: that step drafts nothing (a plain decoding
step). Typical acceptance (the paper's lossy variant) is not offered: every output here is lossless.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel

from ..assistant import TreeAssistant
from ..core.stats import LevelStats, TreeStats
from ..core.accept import path_list
from ..core.strategy import TreeDrafter, TreeStep
from ..core.structure import TokenTree
from ..placement import place_like, target_device_dtype
from ..loading import load_pretrained
from ..core.adapt import AdaptiveBudget
from ..core.budget import VerifyCost
from ..drafters.lookup_branch import LookupBranch
from .beam import beam_rows, beam_search, confident_prefix, kept_nodes, node_probabilities, pack


@dataclass
class ReDrafterStats(TreeStats):
    """:class:`~hf_cascade.core.strategy.TreeStats` of one ``generate()`` call, plus the beams.

    Attributes:
        beam_tokens: ``w' * L'`` tokens the beam search proposed at each drafted step (``L'`` = the
            beam length cut to the remaining length budget).
        drafted_nodes: nodes of the packed tree built from them (before confidence pruning and
            before the loop pruned nodes below an EOS): ``beam_tokens`` with ``dedupe=False``.
        confident_nodes: nodes left after ``min_confidence`` pruning (= ``drafted_nodes`` when it is 0).
        skipped_drafts: steps that drafted nothing (no hidden state yet, or no length budget left).
        draft_forwards: forwards of the head: one per beam-search step (a recurrent step and the logits
            of every live beam), ``L'`` per drafted step.
        draft_tokens: rows those forwards ran (the live beams of each step, :func:`~hf_cascade.redrafter.beam.beam_rows`).

    ``levels`` holds one :class:`~hf_cascade.core.stats.LevelStats` named ``"redrafter"`` with these forwards.
    """

    beam_tokens: list[int] = field(default_factory=list)
    drafted_nodes: list[int] = field(default_factory=list)
    confident_nodes: list[int] = field(default_factory=list)
    skipped_drafts: int = 0
    draft_forwards: int = 0
    draft_tokens: int = 0

    @property
    def compression_ratio(self) -> float:
        """Beam tokens per node of the packed tree, before confidence pruning (the paper's Figure 5b; 1.0 without dedupe)."""
        nodes = sum(self.drafted_nodes)
        return sum(self.beam_tokens) / nodes if nodes else 1.0

    @property
    def draft_cost_ratio(self) -> float:
        """Drafting time over verification time: the cost of one draft (beam search + packing) as a
        fraction of one target forward over the tree (both are done once per step)."""
        verify = self.phase_seconds.get("verify", 0.0)
        return self.phase_seconds.get("draft", 0.0) / verify if verify else 0.0

    def to_dict(self) -> dict:
        out = super().to_dict()
        out.update({
            "beam_tokens": list(self.beam_tokens),
            "drafted_nodes": list(self.drafted_nodes),
            "confident_nodes": list(self.confident_nodes),
            "skipped_drafts": self.skipped_drafts,
            "draft_forwards": self.draft_forwards,
            "draft_tokens": self.draft_tokens,
            "compression_ratio": self.compression_ratio,
            "draft_cost_ratio": self.draft_cost_ratio,
        })
        return out


@dataclass
class _BeamRecord:
    beam_tokens: list[int] = field(default_factory=list)
    drafted_nodes: list[int] = field(default_factory=list)
    confident_nodes: list[int] = field(default_factory=list)
    skipped: int = 0
    forwards: int = 0
    rows: int = 0


class ReDrafterDrafter(TreeDrafter):
    """Beam search with the ReDrafter head below the last verified token (one per ``generate()`` call).

    Args:
        head: a :class:`~hf_cascade.heads.ReDrafterModel` matching the target (see
            :func:`check_head_matches`).
        embed: target token ids ``[b]`` -> the target's input embeddings ``[b, H]``.
        beam_width / beam_length / dedupe / min_confidence: see :class:`ReDrafterAssistant`.
    """

    def __init__(self, head, embed, beam_width: int, beam_length: int, dedupe: bool = True,
                 min_confidence: float = 0.0, verify_cost: VerifyCost | None = None, lookup: bool = False):
        self.head, self.embed = head, embed
        # a resolved VerifyCost: draft and verify what pays on this machine (core.adapt); None: the beams whole
        self.budget = AdaptiveBudget(verify_cost) if verify_cost is not None else None
        self._probs: list[float | None] = []        # (None: a lookup seed)
        # lookup: the sequence's repeats join the beams' tree (drafters.lookup_branch); its cut needs the budget
        self.lookup = LookupBranch() if lookup and self.budget is not None else None
        self.beam_width, self.beam_length, self.dedupe = beam_width, beam_length, dedupe
        self.min_confidence = float(min_confidence)
        self.linear = beam_width == 1                # one beam: a chain, verified without a tree mask
        self.record = _BeamRecord()

    def draft_tree(self, seq: torch.Tensor, state: TreeStep) -> tuple[TokenTree, None]:
        """``w`` beams of ``min(L, budget)`` tokens after ``seq[-1]``, packed into a tree;
        ``draft_probs = None`` (beam search is deterministic given ``seq``)."""
        length = min(self.beam_length, state.budget)
        empty = TokenTree(seq.new_zeros(0), seq.new_zeros(0))
        if state.last_hidden is None or length < 1 or (self.budget is not None and not self.budget.should_draft()):
            self.record.skipped += 1
            return self._joined(empty, [], state), None
        if self.budget is not None:
            self.budget.start_draft()
        beams, _, logp = beam_search(self.head, state.last_hidden, seq[-1], self.embed, self.beam_width, length,
                                     token_logp=True)                                  # [w', L'] each
        rows = beam_rows(self.beam_width, length, int(self.head.draft_vocab_size))
        self.record.forwards += len(rows)                                             # one head forward per step
        self.record.rows += sum(rows)
        beams = beams.to(seq.device)
        tree, beam_to_node = pack(beams, self.dedupe)                                  # n nodes; one read of the beams
        self.record.beam_tokens.append(int(beams.numel()))
        self.record.drafted_nodes.append(tree.num_nodes)
        probs = node_probabilities(tree, beam_to_node, logp) if self.budget is not None else None
        if self.min_confidence > 0:
            keep = kept_nodes(tree, beam_to_node, confident_prefix(logp, self.min_confidence))
            tree = tree.select(keep)
            probs = [p for p, k in zip(probs, keep) if k] if probs is not None else None
        if self.budget is not None:
            self.budget.count_forward(length)                  # one batched head step per beam position
            self.budget.end_draft()
            if self.lookup is not None:
                tree = self._joined(tree, probs, state)
            else:
                tree, self._probs = self.budget.select(tree, probs)
        self.record.confident_nodes.append(tree.num_nodes)
        return tree, None

    def _joined(self, tree: TokenTree, probs: list[float], state: TreeStep) -> TokenTree:
        """``tree`` (the head's probabilities ``probs``) with the lookup branch joined and cut to what pays (the
        tree as it is without a lookup branch)."""
        if self.lookup is None:
            return tree
        tree, self._probs = self.lookup.cut(self.budget, tree, list(probs), state, self.linear)
        return tree

    def on_accept(self, tree: TokenTree, acceptance, state: TreeStep) -> None:
        if self.budget is not None:
            path = path_list(acceptance)
            self.budget.observe_step(tree, self._probs if tree.num_nodes else [], path, len(path) + 1,
                                     state.verify_seconds, state.verify_nodes)
            self._probs = []
            if self.lookup is not None:
                self.lookup.observe(tree, path)


def check_head_matches(head, target: PreTrainedModel) -> None:
    """``ValueError`` unless ``head`` was built for ``target``: same vocabulary size ``V`` (the head's
    token ids are the target's), same hidden size ``H`` (it reads the target's hidden states and
    token embeddings), and a target whose output head exposes its input (the last hidden state)."""
    tc = target.config.get_text_config()
    hc = head.config
    v_target = int(tc.vocab_size)
    if int(hc.vocab_size) != v_target:
        raise ValueError(
            f"the ReDrafter head predicts a vocabulary of {hc.vocab_size} tokens but the target's has {v_target}: "
            "the head must be trained for this target (same tokenizer and vocabulary)."
        )
    emb = target.get_input_embeddings()
    h_target = int(getattr(tc, "hidden_size", emb.weight.shape[-1]))
    if int(hc.hidden_size) != h_target or emb.weight.shape[-1] != h_target:
        raise ValueError(
            f"the ReDrafter head reads hidden states of size {hc.hidden_size} but the target's hidden size is "
            f"{h_target} (embeddings {emb.weight.shape[-1]}): the head must be trained for this target."
        )
    subset = getattr(head, "vocab_subset", None)
    if subset is not None and subset.numel() and int(subset.max()) >= emb.weight.shape[0]:
        raise ValueError(f"the head's vocabulary subset holds id {int(subset.max())}, beyond the target's "
                         f"{emb.weight.shape[0]} embeddings.")
    out = target.get_output_embeddings() if hasattr(target, "get_output_embeddings") else None
    if not isinstance(out, torch.nn.Module):
        raise ValueError("ReDrafter drafts from the target's last hidden state (the input of its output head), "
                         f"but {type(target).__name__} exposes no output-embedding module.")


class ReDrafterAssistant(TreeAssistant):
    """``generate(..., assistant_model=ReDrafterAssistant(head))``: recurrent-drafter speculative decoding.

    Args:
        head: a :class:`~hf_cascade.heads.ReDrafterModel` trained for the target (``hf-cascade train
            redrafter``), or the local directory or Hub repo id of one (loaded with hf_cascade's own classes
            by :func:`hf_cascade.loading.load_pretrained`, no remote code).
        beam_width: ``w``, candidates kept by the beam search (``1``: the head's greedy draft, a chain).
        beam_length: ``L``, draft tokens per candidate (the tree's depth; the reference's
            ``BeamShape.length`` is ``L + 1``, it counts the target's own first token).
        dedupe: verify the packed prefix tree (dynamic tree attention, default) or, ``False``, the
            ``w * L`` beam tokens flat, one branch per beam (same accepted tokens, more computation).
        min_confidence: drop every beam token whose conditional probability under the head is below
            this (and the rest of its beam); ``0`` (default): no fixed floor (``verify_cost`` decides).
        verify_cost: a :class:`~hf_cascade.core.budget.VerifyCost` (default ``VerifyCost()``: measured on the
            target's device at the first call, cached per device kind): each step drafts only when drafting
            pays and verifies only the beam nodes whose chance of acceptance (the head's probabilities,
            calibrated by the target's verdicts) pays for their measured cost
            (:class:`~hf_cascade.core.adapt.AdaptiveBudget`). ``None``: verify the beams whole, as the paper
            does. Deviation from the paper: where a verified token costs time (a CPU, a GPU near its compute
            bound) unlikely tokens do not pay. The tree stays a deterministic function of the context: greedy
            and sampling stay lossless.
        cpu_kernels: ``None`` (automatic), ``True`` or ``False``: see :mod:`hf_cascade.backends`.
        lookup: with ``verify_cost``, join the sequence's own repeats (prompt lookup, frequency-ranked
            continuations) to each tree as a branch estimated by its measured acceptance, also on steps where
            the head does not draft (:mod:`hf_cascade.drafters.lookup_branch`; not in the paper: a head
            trained on chat text guesses poorly where the answer copies the prompt). ``False``: the beams alone.
        revision, token, cache_dir, dtype, device_map: ``from_pretrained``'s options when ``head`` is a path
            or repo id (``dtype`` / ``device_map`` with a loaded model: ``ValueError``).
        place_drafters: at every ``generate()``, move the head to the device of the target's input embeddings
            and cast its float weights to their dtype (:func:`hf_cascade.placement.place_like`; a head
            dispatched with ``device_map`` stays put). ``False``: leave it where it is (hidden states and
            embeddings then move to it at every beam step).

    Greedy outputs equal plain ``generate``; sampling is lossless. After each call
    ``assistant.last_stats`` is a :class:`ReDrafterStats` (tokens per target call, tree sizes,
    accepted paths, beam tokens vs tree nodes = ``compression_ratio``, ``draft_cost_ratio``).

    Example::

        import hf_cascade
        from hf_cascade.redrafter import ReDrafterAssistant
        a = ReDrafterAssistant(hf_cascade.shipped("gemma-3-270m-redrafter-xs"), beam_width=4, beam_length=5)
        out = model.generate(ids, assistant_model=a, max_new_tokens=128)
        a.last_stats.tokens_per_target_call, a.last_stats.compression_ratio
    """

    def __init__(self, head, beam_width: int = 4, beam_length: int = 5, dedupe: bool = True,
                 min_confidence: float = 0.0, cpu_kernels: bool | None = None, verify_cost: VerifyCost | None = VerifyCost(),
                 lookup: bool = True, *, revision: str | None = None,
                 token: str | bool | None = None, cache_dir: str | os.PathLike | None = None, dtype=None, device_map=None,
                 place_drafters: bool = True):
        if isinstance(head, (str, os.PathLike, torch.nn.Module)):
            head = load_pretrained(head, kind="head", revision=revision, token=token, cache_dir=cache_dir, dtype=dtype,
                                   device_map=device_map)
        if not all(hasattr(head, a) for a in ("init_state", "step", "logits", "to_target_ids")):
            raise TypeError(f"head must be a ReDrafterModel (or the path or repo id of one), got {type(head).__name__}")
        if int(beam_width) < 1 or int(beam_length) < 1:
            raise ValueError(f"ReDrafterAssistant needs beam_width >= 1 and beam_length >= 1, "
                             f"got {beam_width} and {beam_length}")
        if not 0.0 <= float(min_confidence) <= 1.0:
            raise ValueError(f"min_confidence must be in [0, 1], got {min_confidence}")
        if verify_cost is not None and not isinstance(verify_cost, VerifyCost):
            raise TypeError(f"verify_cost must be a hf_cascade.core.budget.VerifyCost or None, got {type(verify_cost).__name__}")
        self.head = head.eval()
        self.verify_cost = verify_cost
        self.lookup = bool(lookup) and verify_cost is not None
        self.min_confidence = float(min_confidence)
        self.beam_width, self.beam_length, self.dedupe = int(beam_width), int(beam_length), bool(dedupe)
        self.cpu_kernels = cpu_kernels
        self.place_drafters = bool(place_drafters)

    def bind(self, target: PreTrainedModel) -> None:
        """Place the head on the target's input-embedding device and dtype (``place_drafters``)."""
        if self.place_drafters:
            place_like(self.head, target)

    def new_drafter(
        self, target: PreTrainedModel, generation_config: GenerationConfig, logits_processor: LogitsProcessorList,
        stats=None, target_tokenizer=None,
    ) -> ReDrafterDrafter:
        check_head_matches(self.head, target)
        emb = target.get_input_embeddings()
        device = target_device_dtype(target)[0]                       # offloaded embeddings: their execution device

        def embed(ids: torch.Tensor) -> torch.Tensor:
            return emb(ids.to(device))                                               # [b, H]

        cost = self.verify_cost.resolve(target) if self.verify_cost is not None else None   # measured on this device
        drafter = ReDrafterDrafter(self.head, embed, self.beam_width, self.beam_length, self.dedupe, self.min_confidence,
                                   cost, self.lookup)
        return drafter

    def finish(self, drafter: "ReDrafterDrafter", stats: TreeStats) -> ReDrafterStats:
        """The call's (or a batch row's) statistics as a :class:`ReDrafterStats`, with the drafter's records."""
        record = drafter.record
        out = ReDrafterStats(**{f.name: getattr(stats, f.name) for f in fields(TreeStats) if f.init})
        out.beam_tokens = record.beam_tokens
        out.drafted_nodes = record.drafted_nodes
        out.confident_nodes = record.confident_nodes
        out.skipped_drafts = record.skipped
        out.draft_forwards, out.draft_tokens = record.forwards, record.rows
        out.levels = list(out.levels) + [LevelStats(
            name="redrafter", forward_calls=record.forwards, forward_tokens=record.rows,
            proposals=len(record.beam_tokens), tokens_proposed=sum(out.draft_len_per_call),
            tokens_accepted=sum(out.accepted_per_call))]
        if self.lookup:
            out.levels.append(drafter.lookup.level())
        return out


__all__ = ["ReDrafterAssistant", "ReDrafterDrafter", "ReDrafterStats", "check_head_matches"]
