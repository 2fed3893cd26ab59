"""``generate(..., assistant_model=ReDrafterAssistant(head))``: ReDrafter (Cheng et al., 2024) on the tree loop;
the step itself is :class:`~hf_cascade.redrafter.drafter.ReDrafterDrafter`'s."""

from __future__ import annotations

from dataclasses import fields

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel

from ..assistant import TreeAssistant
from ..core.payoff import DraftPolicy
from ..core.stats import LevelStats, TreeStats
from ..measure import bound_verify_cost
from ..options import Loading, Policy, rejects_moved
from ..placement import place_like, target_device_dtype
from .checks import check_head_matches
from .drafter import ReDrafterDrafter
from .settings import ReDrafterSettings
from .stats import ReDrafterStats


class ReDrafterAssistant(TreeAssistant):
    """``generate(..., assistant_model=ReDrafterAssistant(head))``: recurrent-drafter speculative decoding.

    Args:
        head: a :class:`~hf_cascade.heads.ReDrafterModel` trained for the target (``hf-cascade train
            redrafter``), or the local directory or Hub repo id of one (loaded with hf_cascade's own classes
            by :func:`hf_cascade.loading.load_pretrained`, no remote code).
        settings: the beam search's shape (:class:`~hf_cascade.redrafter.settings.ReDrafterSettings`:
            ``beam_width``, ``beam_length``, ``dedupe``, ``min_confidence``).
        policy: beyond the paper (:class:`~hf_cascade.options.Policy`): by default each step drafts only when
            drafting pays and verifies only the beam nodes whose chance of acceptance (the head's probabilities,
            calibrated by the target's verdicts) pays for their measured cost
            (:class:`~hf_cascade.core.payoff.AdaptiveBudget`; the verification profile measured on the target's
            device when the assistant binds), and the sequence's own repeats (prompt lookup) join each tree as a
            branch rated by its measured acceptance, also on steps where the head does not draft
            (:mod:`hf_cascade.drafters.lookup_branch`: a head trained on chat text guesses poorly where the answer
            copies the prompt). ``Policy.paper()``: the beams whole, as the paper verifies them. The tree stays a
            deterministic function of the context: greedy and sampling stay lossless.
        cpu_kernels: ``None`` (automatic), ``True`` or ``False``: see :mod:`hf_cascade.backends`.
        loading: :class:`~hf_cascade.options.Loading`: ``from_pretrained``'s options when ``head`` is a path or repo
            id, and whether the head is placed like the target's input embeddings at every call (``place=False``:
            hidden states and embeddings then move to it at every beam step).

    Greedy outputs equal plain ``generate``; sampling is lossless. After each call
    ``assistant.last_stats`` is a :class:`ReDrafterStats` (tokens per target call, tree sizes,
    accepted paths, beam tokens vs tree nodes = ``compression_ratio``, ``draft_cost_ratio``).

    Example::

        import hf_cascade
        from hf_cascade.redrafter import ReDrafterAssistant, ReDrafterSettings
        head = hf_cascade.shipped("gemma-3-270m-redrafter-xs")
        a = ReDrafterAssistant(head, settings=ReDrafterSettings(beam_width=2))
        out = model.generate(ids, assistant_model=a, max_new_tokens=128)
        a.last_stats.tokens_per_target_call, a.last_stats.compression_ratio
    """

    @rejects_moved(
        ReDrafterSettings, "beam_width", "beam_length", "dedupe", "min_confidence", loading=True, policy=True
    )
    def __init__(
        self,
        head,
        *,
        settings: ReDrafterSettings | None = None,
        policy: Policy | None = None,
        cpu_kernels: bool | None = None,
        loading: Loading | None = None,
    ):
        self.settings, self.policy = ReDrafterSettings.of(settings), Policy.of(policy)
        self.loading = Loading.of(loading)
        head = self.loading.load(
            head, "head", "ReDrafterModel", needs=("init_state", "step", "logits", "to_target_ids")
        )
        self.head = head.eval()
        self.cpu_kernels = cpu_kernels

    def drafts_branches(self) -> bool:
        """Several beams make a tree; one beam is a chain (:class:`~hf_cascade.redrafter.drafter.ReDrafterDrafter`)."""
        return self.settings.beam_width > 1

    def bind(self, target: PreTrainedModel) -> None:
        """Place the head on the target's input-embedding device and dtype (``loading.place``); the verification
        profile the cost rule uses, measured on the target's device at the first call
        (:func:`~hf_cascade.measure.bound_verify_cost`)."""
        if self.loading.place:
            place_like(self.head, target)
        self.verify_cost = bound_verify_cost(self.policy, target)

    @property
    def lookup(self) -> bool:
        """Whether its drafts carry the lookup branch: ``Policy.lookup``, under the cost rule that cuts it (the
        drafter's :class:`~hf_cascade.core.payoff.DraftPolicy` decides the same)."""
        return self.policy.lookup and self.policy.cost_aware

    def new_drafter(
        self,
        target: PreTrainedModel,
        generation_config: GenerationConfig,
        logits_processor: LogitsProcessorList,
        stats=None,
        target_tokenizer=None,
    ) -> ReDrafterDrafter:
        check_head_matches(self.head, target)
        emb = target.get_input_embeddings()
        device = target_device_dtype(target)[0]  # offloaded embeddings: their execution device

        def embed(ids: torch.Tensor) -> torch.Tensor:
            return emb(ids.to(device))  # [b, H]

        s = self.settings
        return ReDrafterDrafter(
            self.head,
            embed,
            s.beam_width,
            s.beam_length,
            s.dedupe,
            s.min_confidence,
            DraftPolicy.of(self.policy, self.verify_cost),
            self.memory,
        )

    def finish(self, drafter: ReDrafterDrafter, stats: TreeStats) -> ReDrafterStats:
        """The call's (or a batch row's) statistics as a :class:`ReDrafterStats`, with the drafter's records."""
        record = drafter.record
        out = ReDrafterStats(**{f.name: getattr(stats, f.name) for f in fields(TreeStats) if f.init})
        out.beam_tokens = record.beam_tokens
        out.drafted_nodes = record.drafted_nodes
        out.confident_nodes = record.confident_nodes
        out.skipped_drafts = record.skipped
        out.draft_forwards, out.draft_tokens = record.forwards, record.rows
        out.levels = list(out.levels) + [
            LevelStats(
                name="redrafter",
                forward_calls=record.forwards,
                forward_tokens=record.rows,
                proposals=len(record.beam_tokens),
                tokens_proposed=sum(out.draft_len_per_call),
                tokens_accepted=sum(out.accepted_per_call),
            )
        ]
        if drafter.lookup is not None:
            out.levels.append(drafter.lookup.level())
        return out


__all__ = ["ReDrafterAssistant"]
