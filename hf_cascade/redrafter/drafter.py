"""ReDrafter decoding on the tree loop (``generate(..., assistant_model=ReDrafterAssistant(head))``): the step.

Cheng et al. (2024), "Recurrent Drafter for Fast Speculative Decoding in Large Language Models",
Section 2 ("Speculative decoding with ReDrafter"). Each step, draft -> verify -> accept -> update:

1. **Draft** (:class:`ReDrafterDrafter`): the target's last hidden state ``x`` (handed over by the
   tree loop as :attr:`TreeStep.last_hidden`, captured during the previous target pass: no extra
   target forward) and the token the target produced from it (the root, ``seq[-1]``) start a beam
   search with the recurrent head (:func:`~hf_cascade.redrafter.beam.beam_search`): ``w`` beams of
   ``L`` draft tokens.
2. **Pack**: the beams' shared prefixes are deduplicated as by Listing 1
   (:func:`~hf_cascade.redrafter.beam.get_prefix_match`) into a token tree
   (:func:`~hf_cascade.redrafter.beam.pack`: dynamic tree attention). ``dedupe=False`` verifies the ``w * L``
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

from dataclasses import dataclass, field

import torch

from ..core.compiled import compiled_draft, records_graphs
from ..core.payoff import DraftPolicy
from ..core.strategy import TreeDrafter, TreeStep
from ..core.structure import TokenTree
from ..drafters.lookup_branch import LookupBranch, observe_verdict
from ..drafters.memory import AnswerMemory
from .beam import (
    beam_rows,
    beam_search,
    confident_prefix,
    head_device_dtype,
    kept_nodes,
    node_probabilities,
    pack,
    read_beams,
)


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
            :func:`~hf_cascade.redrafter.checks.check_head_matches`).
        embed: target token ids ``[b]`` -> the target's input embeddings ``[b, H]``.
        beam_width / beam_length / dedupe / min_confidence: see :class:`~hf_cascade.redrafter.ReDrafterAssistant`.
    """

    def __init__(
        self,
        head,
        embed,
        beam_width: int,
        beam_length: int,
        dedupe: bool = True,
        min_confidence: float = 0.0,
        policy: DraftPolicy | None = None,
        memory: AnswerMemory | None = None,
    ):
        self.head, self.embed = head, embed
        # what pays on this machine: whether to draft, which nodes (core.payoff); the beams whole without
        self.policy = policy if policy is not None else DraftPolicy(cost_aware=False)
        self._probs: list[float | None] = []  # (None: a lookup seed)
        # the sequence's repeats join the beams' tree (drafters.lookup_branch), cut by the policy
        self.lookup = LookupBranch(memory=memory) if self.policy.lookup else None
        self.beam_width, self.beam_length, self.dedupe = beam_width, beam_length, dedupe
        self.min_confidence = float(min_confidence)
        self.linear = beam_width == 1  # one beam: a chain, verified without a tree mask
        self.record = _BeamRecord()
        self.search = beam_search  # compiled where verification is (compile_forwards)
        self._copies = False  # the search's outputs are overwritten by its next run (graphs)
        self._rows: dict[int, list[int]] = {}  # beam length -> the head's rows per step (beam_rows)
        self._head_device_dtype: tuple | None = None  # the head's (device, dtype), read at the first search

    def _device_dtype(self) -> tuple:
        """The head's device and floating dtype, read once per ``generate()`` call (the assistant places the head
        when it binds, before the call's drafter is made)."""
        if self._head_device_dtype is None:
            self._head_device_dtype = head_device_dtype(self.head)
        return self._head_device_dtype

    def compile_forwards(self, compile_config) -> None:
        """The beam search as one compiled graph per width (always the full length; :meth:`draft_tree` cuts the beams
        where fewer tokens may still be emitted): on an accelerator its ``L`` head steps, top-k and gathers are
        launch-bound, as verification is."""
        self.search = compiled_draft(self.head, beam_search, compile_config, _search_key)
        self._copies = records_graphs(compile_config)

    def draft_tree(self, seq: torch.Tensor, state: TreeStep) -> tuple[TokenTree, None]:
        """``w`` beams of ``min(L, budget)`` tokens after ``seq[-1]``, packed into a tree;
        ``draft_probs = None`` (beam search is deterministic given ``seq``)."""
        length = min(self.beam_length, state.budget)
        if state.last_hidden is None or not self.policy.plan(length):
            self.record.skipped += 1
            return self._joined(TokenTree.empty(seq.device), [], state), None
        self.policy.start_draft(seq.device)
        # compiled: always the full length, one graph per width, and the beams cut to ``length`` (only the last
        # steps of a generation ask for fewer tokens: a graph per length would compile there, mid-generation)
        eager = self.search is beam_search
        searched = length if eager else self.beam_length
        # eager: the head's device and dtype read once per call (the compiled graph's arguments stay as they were)
        extra = {"device_dtype": self._device_dtype()} if eager else {}
        beams, _, logp = self.search(
            self.head, state.last_hidden, seq[-1], self.embed, self.beam_width, searched, token_logp=True, **extra
        )  # [w', L'] each
        if not eager:  # the full length: the beams cut to ``length``
            beams, logp = beams[:, :length], logp[:, :length]
        if self._copies:  # a CUDA graph's outputs are overwritten by its next run
            beams, logp = beams.clone(), logp.clone()
        rows = self._rows.get(searched)
        if rows is None:
            rows = self._rows[searched] = beam_rows(self.beam_width, searched, int(self.head.draft_vocab_size))
        self.record.forwards += len(rows)  # one head forward per step
        self.record.rows += sum(rows)
        beams = beams.to(seq.device)
        host_beams, host_probs = read_beams(beams, logp)  # the draft's one read
        tree, beam_to_node = pack(beams, self.dedupe, rows=host_beams)  # n nodes
        self.record.beam_tokens.append(int(beams.numel()))
        self.record.drafted_nodes.append(tree.num_nodes)
        probs = node_probabilities(tree, beam_to_node, host_probs) if self.policy.reads_scores else None
        if self.min_confidence > 0:
            keep = kept_nodes(tree, beam_to_node, confident_prefix(logp, self.min_confidence))
            tree = tree.select(keep)
            probs = [p for p, k in zip(probs, keep) if k] if probs is not None else None
        self.policy.count_forward(searched)  # one batched head step per beam position
        self.policy.end_draft()
        if self.lookup is not None:
            tree = self._joined(tree, probs, state)
        else:
            tree, self._probs = self.policy.select(tree, probs)
        self.record.confident_nodes.append(tree.num_nodes)
        return tree, None

    def _joined(self, tree: TokenTree, probs: list[float], state: TreeStep) -> TokenTree:
        """``tree`` (the head's probabilities ``probs``) with the lookup branch joined and cut to what pays (the
        tree as it is without a lookup branch)."""
        if self.lookup is None:
            return tree
        tree, self._probs = self.lookup.cut(self.policy, tree, list(probs), state, self.linear)
        return tree

    def on_accept(self, tree: TokenTree, acceptance, state: TreeStep) -> None:
        observe_verdict(self.policy, self.lookup, tree, self._probs, acceptance, state)
        self._probs = []


def _search_key(args, kwargs) -> tuple:
    """What makes one graph of the compiled beam search: the hidden state's shape, the width and the length."""
    return tuple(args[1].shape), args[4], args[5]


__all__ = ["ReDrafterDrafter"]
