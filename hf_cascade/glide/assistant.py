"""``generate(..., assistant_model=GlideAssistant(glide))``: GLIDE + CAPE (Du et al., ICML 2024) verified as a
token tree by :mod:`hf_cascade.core`; the step itself is :class:`~hf_cascade.glide.drafter.GlideDrafter`'s."""

from __future__ import annotations

from dataclasses import fields

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel

from ..assistant import TreeAssistant
from ..core.payoff import DraftPolicy
from ..core.stats import LevelStats, TreeStats
from ..measure import bound_verify_cost
from ..options import Loading, Policy, rejects_moved
from ..placement import place_like
from ..processors import split_processors
from .checks import check_glide_matches
from .drafter import GlideDrafter
from .settings import GlideSettings
from .stats import _RECORDED, GlideStats


class GlideAssistant(TreeAssistant):
    """``generate(..., assistant_model=GlideAssistant(glide))``: GLIDE drafting (optionally with CAPE),
    verified as a token tree in one target forward per step.

    Args:
        glide_model: a :class:`~hf_cascade.heads.GlideForCausalLM` built for the target (``hf-cascade train
            glide``), or the local directory or Hub repo id of one (hf_cascade's own classes, no remote code:
            :func:`hf_cascade.loading.load_pretrained`). A GLIDE with ``cross_attention=False`` (the paper's
            Vanilla Drafter baseline) works too: it drafts without reading the target's cache.
        settings: the draft's shape (:class:`~hf_cascade.glide.settings.GlideSettings`: ``draft_length``, CAPE's
            :class:`~hf_cascade.glide.cape.CapeSettings`, ``min_confidence``); default: the paper's GLIDE + CAPE,
            ``GlideSettings.chain()``: GLIDE alone.
        policy: beyond the paper (:class:`~hf_cascade.options.Policy`): by default each step drafts, and verifies,
            only what pays for its cost on this hardware (the verification profile measured on the target's
            device when the assistant binds, the draft's probabilities calibrated by the target's verdicts:
            :class:`~hf_cascade.core.payoff.AdaptiveBudget`, whether to draft, how deep, which nodes), and the
            sequence's own repeats (prompt lookup) join each tree as a branch rated by its measured acceptance,
            also on steps where the GLIDE does not draft (:mod:`hf_cascade.drafters.lookup_branch`; under
            sampling, seeds join a drawn main path as point-mass siblings, and a drawn chain goes alone).
            ``Policy.paper()``: draft ``draft_length`` tokens and verify everything drafted, as the paper does.
            Lossless either way.
        cpu_kernels: ``None`` (automatic), ``True`` or ``False``: see :mod:`hf_cascade.backends`.
        loading: :class:`~hf_cascade.options.Loading`: ``from_pretrained``'s options when ``glide_model`` is a path
            or repo id, and whether the GLIDE is placed like the target's input embeddings (device, dtype) at every
            call (``place=False``: its K/V then cross at every forward).

    Greedy outputs equal plain ``generate``; sampling is lossless (drawn or argmax main paths, see
    :mod:`hf_cascade.glide.drafter`). After each call ``assistant.last_stats`` is a :class:`GlideStats` (tokens
    per target call, tree sizes, accepted paths, expansion sizes, ``draft_forward_cost``).

    Example::

        import hf_cascade
        from hf_cascade.glide import GlideAssistant, GlideSettings
        a = GlideAssistant(hf_cascade.shipped("gemma-3-270m-glide-xs"), settings=GlideSettings.chain())
        out = model.generate(ids, assistant_model=a, max_new_tokens=128)
        a.last_stats.tokens_per_target_call, a.last_stats.draft_forward_cost
    """

    @rejects_moved(
        GlideSettings,
        "cape",
        "draft_length",
        "min_confidence",
        loading=True,
        policy=True,
        **{
            old: f"settings=GlideSettings(cape=CapeSettings({new}=...))"
            for old, new in (
                ("cape_sizes", "sizes"),
                ("cape_thresholds", "thresholds"),
                ("max_tree_nodes", "max_nodes"),
                ("min_expansion_prob", "min_prob"),
            )
        },
    )
    def __init__(
        self,
        glide_model,
        *,
        settings: GlideSettings | None = None,
        policy: Policy | None = None,
        cpu_kernels: bool | None = None,
        loading: Loading | None = None,
    ):
        self.settings, self.policy, self.loading = GlideSettings.of(settings), Policy.of(policy), Loading.of(loading)
        glide_model = self.loading.load(
            glide_model, "glide_model", "GlideForCausalLM", needs=("target_kv", "tie_to_target", "to_draft_ids")
        )
        self.glide = glide_model.eval()
        self.cpu_kernels = cpu_kernels

    def bind(self, target: PreTrainedModel) -> None:
        """Place the GLIDE like the target (``loading.place``: a float32 GLIDE on a bf16 target is cast once here,
        not the K/V at every forward); the verification profile the cost rule uses, measured on the target's
        device at the first call (:func:`~hf_cascade.measure.bound_verify_cost`)."""
        if self.loading.place:
            place_like(self.glide, target)
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
    ) -> GlideDrafter:
        check_glide_matches(self.glide, target)
        eos = generation_config.eos_token_id
        stop = [] if eos is None else [eos] if isinstance(eos, int) else list(torch.as_tensor(eos).flatten().tolist())
        processors = split_processors(logits_processor)[0] if generation_config.do_sample else None
        return GlideDrafter(
            self.glide, self.settings, stop, processors, DraftPolicy.of(self.policy, self.verify_cost), self.memory
        )

    def drafts_branches(self) -> bool:
        """CAPE's trees branch; without CAPE every draft is a chain
        (:class:`~hf_cascade.glide.drafter.GlideDrafter`)."""
        return self.settings.cape is not None

    @property
    def block_kind(self) -> str:
        """CAPE's trees and the chain read their rows differently: their steps are kept apart."""
        return "GlideAssistant" + ("+cape" if self.settings.cape is not None else "")

    def finish(self, drafter: GlideDrafter, stats: TreeStats) -> GlideStats:
        """The call's (or a batch row's) statistics as a :class:`GlideStats`, with the drafter's records."""
        out = GlideStats(**{f.name: getattr(stats, f.name) for f in fields(TreeStats) if f.init})
        for name in _RECORDED:
            setattr(out, name, getattr(drafter.record, name))
        name = "glide+cape" if self.settings.cape is not None else "glide"
        out.levels = list(out.levels) + [
            LevelStats(
                name=name,
                forward_calls=out.draft_forwards,
                forward_tokens=out.draft_tokens,
                proposals=len(out.main_lengths),
                tokens_proposed=sum(out.draft_len_per_call),
                tokens_accepted=sum(out.accepted_per_call),
            )
        ]
        if drafter.lookup is not None:
            out.levels.append(drafter.lookup.level())
        return out


__all__ = ["GlideAssistant"]
