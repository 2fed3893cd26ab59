"""``generate(..., assistant_model=ReDrafterAssistant(head))``: ReDrafter (Cheng et al., 2024) on the tree loop;
the step itself is :class:`~hf_cascade.redrafter.drafter.ReDrafterDrafter`'s."""

from __future__ import annotations

import os
from dataclasses import fields

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel

from ..assistant import TreeAssistant
from ..core.payoff import VerifyCost
from ..core.stats import LevelStats, TreeStats
from ..loading import load_pretrained
from ..measure import bound_verify_cost
from ..placement import place_like, target_device_dtype
from .checks import check_head_matches
from .drafter import ReDrafterDrafter
from .stats import ReDrafterStats


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
        verify_cost: a :class:`~hf_cascade.core.payoff.VerifyCost` (default ``VerifyCost()``: measured on the
            target's device at the first call, cached per device kind): each step drafts only when drafting
            pays and verifies only the beam nodes whose chance of acceptance (the head's probabilities,
            calibrated by the target's verdicts) pays for their measured cost
            (:class:`~hf_cascade.core.payoff.AdaptiveBudget`). ``None``: verify the beams whole, as the paper
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
            raise TypeError(f"verify_cost must be a hf_cascade.core.payoff.VerifyCost or None, got {type(verify_cost).__name__}")
        self.head = head.eval()
        self.verify_cost = verify_cost
        self.lookup = bool(lookup) and verify_cost is not None
        self.min_confidence = float(min_confidence)
        self.beam_width, self.beam_length, self.dedupe = int(beam_width), int(beam_length), bool(dedupe)
        self.cpu_kernels = cpu_kernels
        self.place_drafters = bool(place_drafters)

    def bind(self, target: PreTrainedModel) -> None:
        """Place the head on the target's input-embedding device and dtype (``place_drafters``); measure the
        verification profile of ``VerifyCost()`` (once per device kind)."""
        if self.place_drafters:
            place_like(self.head, target)
        self.bound_cost = bound_verify_cost(self.verify_cost, target)

    def new_drafter(
        self, target: PreTrainedModel, generation_config: GenerationConfig, logits_processor: LogitsProcessorList,
        stats=None, target_tokenizer=None,
    ) -> ReDrafterDrafter:
        check_head_matches(self.head, target)
        emb = target.get_input_embeddings()
        device = target_device_dtype(target)[0]                       # offloaded embeddings: their execution device

        def embed(ids: torch.Tensor) -> torch.Tensor:
            return emb(ids.to(device))                                               # [b, H]

        drafter = ReDrafterDrafter(self.head, embed, self.beam_width, self.beam_length, self.dedupe, self.min_confidence,
                                   self.bound_cost, self.lookup)
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


__all__ = ["ReDrafterAssistant"]
