"""``generate(..., assistant_model=GlideAssistant(glide))``: GLIDE + CAPE (Du et al., ICML 2024) verified as a
token tree by :mod:`hf_cascade.core`; the step itself is :class:`~hf_cascade.glide.drafter.GlideDrafter`'s."""

from __future__ import annotations

import os
from dataclasses import fields, replace

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel

from ..assistant import TreeAssistant
from ..core.payoff import VerifyCost
from ..core.stats import LevelStats, TreeStats
from ..loading import load_pretrained
from ..measure import bound_verify_cost
from ..placement import place_like
from ..processors import split_processors
from .cape import CapeSettings
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
        cape: expand the proposal with CAPE (a tree); ``False`` drafts a chain.
        draft_length: main-path tokens per step (``gamma``).
        cape_sizes / cape_thresholds: CAPE's ``S(p)`` (:class:`~hf_cascade.glide.cape.CapeSettings`; paper:
            7/5/3/1 for ``p`` in (0,.3], (.3,.6], (.6,.8], (.8,1]).
        max_tree_nodes: most tree nodes per verification (``None``: no cap; the paper's CAPE verifies <= 32).
        min_confidence: stop the main path at the first token the draft gives probability below it (a
            chain leaves that token out, CAPE verifies it with its expansion set unless its path is below
            ``min_expansion_prob``); 0 = the paper's fixed ``draft_length``. Not in the paper; see
            :class:`GlideSettings`.
        min_expansion_prob: CAPE leaves out expansion tokens whose path the draft gives probability below it
            (own probability x the main confidences above; 0 = the paper's ``S(p)`` sets in full; see
            :class:`~hf_cascade.glide.cape.CapeSettings`).
        verify_cost: a :class:`~hf_cascade.core.payoff.VerifyCost` (default ``VerifyCost()``: measured on the
            target's device at the first call, cached per device kind; or a table, e.g. from
            :func:`~hf_cascade.measure.measure_verify_cost`): each step drafts, and verifies, only what pays
            for its cost on this hardware, with the draft's probabilities calibrated by the target's verdicts
            (:class:`~hf_cascade.core.payoff.AdaptiveBudget`: whether to draft, how deep, which nodes). ``None``:
            draft ``draft_length`` tokens and verify everything drafted, as the paper does. Not in the paper;
            lossless either way.
        lookup: with ``verify_cost``, join the sequence's own repeats (prompt lookup, frequency-ranked
            continuations) to each tree as a branch estimated by its measured acceptance, also on steps where
            the GLIDE does not draft (:mod:`hf_cascade.drafters.lookup_branch`; not in the paper: a drafter
            trained on chat text guesses poorly where the answer copies the prompt). Under sampling, seeds
            join a drawn main path as separate point-mass siblings (a drawn chain, ``cape=False``, goes alone);
            ``False``: GLIDE's tree alone.
        cpu_kernels: ``None`` (automatic), ``True`` or ``False``: see :mod:`hf_cascade.backends`.
        revision, token, cache_dir, dtype, device_map: ``from_pretrained``'s options when ``glide_model`` is
            a path or repo id (``dtype`` / ``device_map`` with a loaded model: ``ValueError``).
        place_drafters: place the GLIDE like the target's input embeddings (device, dtype) at every call
            (:func:`hf_cascade.placement.place_like`); ``False``: leave it (K/V then cross at every forward).

    Greedy outputs equal plain ``generate``; sampling is lossless (drawn or argmax main paths, see
    :mod:`hf_cascade.glide.drafter`). After each call ``assistant.last_stats`` is a :class:`GlideStats` (tokens
    per target call, tree sizes, accepted paths, expansion sizes, ``draft_forward_cost``).

    Example::

        import hf_cascade
        from hf_cascade.glide import GlideAssistant
        a = GlideAssistant(hf_cascade.shipped("gemma-3-270m-glide-xs"), cape=True)   # or a Hub repo id
        out = model.generate(ids, assistant_model=a, max_new_tokens=128)
        a.last_stats.tokens_per_target_call, a.last_stats.draft_forward_cost
    """

    def __init__(self, glide_model, cape: bool = True, draft_length: int = 5,
                 cape_sizes: tuple[int, ...] = (7, 5, 3, 1), cape_thresholds: tuple[float, ...] = (0.3, 0.6, 0.8),
                 max_tree_nodes: int | None = None, min_confidence: float = 0.0, min_expansion_prob: float = 0.0,
                 verify_cost: VerifyCost | None = VerifyCost(), cpu_kernels: bool | None = None, lookup: bool = True, *,
                 revision: str | None = None,
                 token: str | bool | None = None, cache_dir: str | os.PathLike | None = None, dtype=None, device_map=None,
                 place_drafters: bool = True):
        if isinstance(glide_model, (str, os.PathLike, torch.nn.Module)):
            glide_model = load_pretrained(glide_model, kind="glide_model", revision=revision, token=token,
                                          cache_dir=cache_dir, dtype=dtype, device_map=device_map)
        if not all(hasattr(glide_model, a) for a in ("target_kv", "tie_to_target", "to_draft_ids")):
            raise TypeError(f"glide_model must be a GlideForCausalLM (or the path or repo id of one), "
                            f"got {type(glide_model).__name__}")
        cape_settings = (CapeSettings(tuple(cape_sizes), tuple(cape_thresholds), max_tree_nodes, float(min_expansion_prob))
                         if cape else None)
        if verify_cost is not None and not isinstance(verify_cost, VerifyCost):
            raise TypeError(f"verify_cost must be a hf_cascade.core.payoff.VerifyCost or None, got {type(verify_cost).__name__}")
        self.settings = GlideSettings(int(draft_length), cape_settings, float(min_confidence), verify_cost,
                                      bool(lookup) and verify_cost is not None)
        self.glide = glide_model.eval()
        self.cpu_kernels = cpu_kernels
        self.place_drafters = bool(place_drafters)

    def bind(self, target: PreTrainedModel) -> None:
        """``place_drafters``: a float32 GLIDE on a bf16 target is cast once here, not the K/V at every forward; the
        verification profile of ``VerifyCost()`` is measured here (once per device kind)."""
        if self.place_drafters:
            place_like(self.glide, target)
        self.bound_cost = bound_verify_cost(self.settings.verify_cost, target)

    def new_drafter(self, target: PreTrainedModel, generation_config: GenerationConfig,
                    logits_processor: LogitsProcessorList, stats=None, target_tokenizer=None) -> GlideDrafter:
        check_glide_matches(self.glide, target)
        eos = generation_config.eos_token_id
        stop = [] if eos is None else [eos] if isinstance(eos, int) else list(torch.as_tensor(eos).flatten().tolist())
        settings = replace(self.settings, verify_cost=self.bound_cost)
        processors = split_processors(logits_processor)[0] if generation_config.do_sample else None
        return GlideDrafter(self.glide, settings, stop, processors)

    def finish(self, drafter: GlideDrafter, stats: TreeStats) -> GlideStats:
        """The call's (or a batch row's) statistics as a :class:`GlideStats`, with the drafter's records."""
        out = GlideStats(**{f.name: getattr(stats, f.name) for f in fields(TreeStats) if f.init})
        for name in _RECORDED:
            setattr(out, name, getattr(drafter.record, name))
        name = "glide+cape" if self.settings.cape is not None else "glide"
        out.levels = list(out.levels) + [LevelStats(
            name=name, forward_calls=out.draft_forwards, forward_tokens=out.draft_tokens,
            proposals=len(out.main_lengths),
            tokens_proposed=sum(out.draft_len_per_call), tokens_accepted=sum(out.accepted_per_call))]
        if self.settings.lookup:
            out.levels.append(drafter.lookup.level())
        return out


__all__ = ["GlideAssistant"]
