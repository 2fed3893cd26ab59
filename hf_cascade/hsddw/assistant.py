"""``DynamicWindowAssistant``: what users pass as ``generate(assistant_model=...)`` for HSDDW."""

from __future__ import annotations

import numbers
import os

from torch.nn import Module
from transformers import PreTrainedModel

from ..assistant import LinearAssistant
from ..drafters.neural import check_same_vocabulary
from ..loading import load_pretrained
from ..placement import place_like
from .drafter import DynamicWindowCandidateGenerator
from .rules import check_threshold
from .stats import DynamicWindowStats

#: Default cap of the window the target verifies, in multiples of ``max_window`` (the authors' code
#: hands the accumulated tokens to the target once there are more than 50, with K = 10).
TARGET_WINDOW_FACTOR = 5


class DynamicWindowAssistant(LinearAssistant):
    """Hierarchical Speculative Decoding with Dynamic Window (HSDDW) for ``model.generate``.

    Args:
        draft_model: the fast draft model (``M_q1``); any HF causal LM sharing the target's tokenizer,
            loaded or as a local directory or Hub repo id (loaded here by
            :func:`hf_cascade.loading.load_pretrained`).
        verifier_model: optional stronger draft model (``M_q2``, loaded or a path / repo id) that
            pre-verifies the fast model's tokens (Algorithm 2). Without it: SD + Self-verify (Algorithm 1).
        max_window: most tokens the draft model drafts per Draft + Self-verify stage (the paper's
            ``K``; 10 in its experiments).
        tau_init: the draft model's starting confidence threshold (nats). The paper starts at 0: the
            first token always stops the window (one token per window) until the first rejection.
            ``float("inf")`` disables self-verify (fixed windows of ``max_window``).
        tau2_init: the pre-verifier's starting threshold (same conventions).
        max_target_window: most tokens handed to the target per step with a pre-verifier
            (default ``5 * max_window``).
        tokenizer: optional tokenizer of the draft models, for an exact vocabulary check when
            ``generate(..., tokenizer=...)`` is also given.
        cpu_kernels: the verification backend switch (see :class:`~hf_cascade.assistant.Assistant`).
        revision, token, cache_dir, dtype, device_map: ``from_pretrained``'s options for the models given
            as paths or repo ids (``dtype`` / ``device_map`` with an already loaded model: ``ValueError``).
        place_drafters: at every ``generate()``, move both draft models to the device of the target's input
            embeddings and cast their float weights to their dtype (:func:`hf_cascade.placement.place_like`;
            a model dispatched with ``device_map`` stays put). ``False``: leave them where they are (the
            pre-verifier reviews on its own device; tokens cross devices explicitly).
        lookup: first ask Max-Gram prompt lookup (:class:`~hf_cascade.drafters.maxgram.MaxGram`, default
            settings) at every target step; when it proposes tokens (as many as its adaptive lookahead finds
            worth verifying, at most ``max_window``) they are the step's draft and the draft models do not
            run. Not in the paper; pays off where the output copies the prompt (extraction, translation).
            Lossless. ``False``: the paper's drafter alone. Its statistics are the last level, ``"maxgram"``.
        cost_aware: the draft models draft a step only while they are expected to pay for their forwards and
            the rows they add to the target's step, as measured in the call
            (:class:`~hf_cascade.core.payoff.DrafterPayoff`); a step they would not pay for is a plain
            one, and every 8th such step drafts anyway, to keep measuring. Not in the paper; the windows stay
            the paper's. Lossless. ``False``: the draft models draft every step the lookup leaves.

    After each call ``assistant.last_stats`` is a :class:`~hf_cascade.hsddw.DynamicWindowStats`:
    window per step, redundancy sigma, target utilisation eta, tau trajectories, calls per model.

    Example::

        import hf_cascade
        a = hf_cascade.DynamicWindowAssistant(small_model, verifier_model=medium_model)
        out = model.generate(ids, assistant_model=a, max_new_tokens=128)
        a.last_stats.window_per_step, a.last_stats.redundancy, a.last_stats.target_utilization
    """

    last_stats: DynamicWindowStats | None = None

    def __init__(
        self,
        draft_model: PreTrainedModel | str | os.PathLike,
        verifier_model: PreTrainedModel | str | os.PathLike | None = None,
        max_window: int = 10,
        tau_init: float = 0.0,
        tau2_init: float = 0.0,
        max_target_window: int | None = None,
        tokenizer=None,
        cpu_kernels: bool | None = None,
        *,
        revision: str | None = None,
        token: str | bool | None = None,
        cache_dir: str | os.PathLike | None = None,
        dtype=None,
        device_map=None,
        place_drafters: bool = True,
        lookup: bool = True,
        cost_aware: bool = True,
    ):
        hub = dict(revision=revision, token=token, cache_dir=cache_dir, dtype=dtype, device_map=device_map)
        paths = [os.fspath(m) if isinstance(m, (str, os.PathLike)) else m for m in (draft_model, verifier_model)]
        if isinstance(draft_model, (str, os.PathLike, Module)):
            draft_model = load_pretrained(draft_model, kind="draft_model", **hub)
        if isinstance(verifier_model, (str, os.PathLike, Module)):
            verifier_model = (draft_model if paths[0] == paths[1]
                              else load_pretrained(verifier_model, kind="verifier_model", **hub))
        _check_model(draft_model, "draft_model")
        if verifier_model is not None:
            _check_model(verifier_model, "verifier_model")
            if verifier_model is draft_model:
                raise ValueError("verifier_model must be a different (stronger) model than draft_model; "
                                 "for one draft model leave verifier_model=None (SD + Self-verify).")
        self.max_window = _check_int(max_window, "max_window")
        if max_target_window is not None and verifier_model is None:
            raise ValueError("max_target_window only applies with a verifier_model; without one the window is max_window.")
        self.max_target_window = _check_int(
            TARGET_WINDOW_FACTOR * self.max_window if max_target_window is None else max_target_window, "max_target_window")
        self.tau_init = check_threshold(tau_init, "tau_init")
        self.tau2_init = check_threshold(tau2_init, "tau2_init")
        self.draft_model = draft_model
        self.verifier_model = verifier_model
        self.tokenizer = tokenizer
        self.cpu_kernels = cpu_kernels
        self.place_drafters = bool(place_drafters)
        self.lookup = bool(lookup)
        self.cost_aware = bool(cost_aware)

    def bind(self, target) -> None:
        """Place the draft model and the pre-verifier on the target's input-embedding device and dtype
        (``place_drafters``)."""
        if self.place_drafters:
            for model in (self.draft_model, self.verifier_model):
                if model is not None and model is not target:
                    place_like(model, target)

    def new_stats(self) -> DynamicWindowStats:
        return DynamicWindowStats()

    def build(self, target, generation_config, logits_processor, stats, target_tokenizer=None) -> DynamicWindowCandidateGenerator:
        for model in (self.draft_model, self.verifier_model):
            if model is target:
                raise ValueError("The target cannot be its own draft model or pre-verifier.")
            if model is not None:
                check_same_vocabulary(target, model, target_tokenizer, self.tokenizer)
        return DynamicWindowCandidateGenerator(
            target, generation_config, logits_processor, stats, self.draft_model, self.verifier_model,
            self.max_window, self.max_target_window, self.tau_init, self.tau2_init, lookup=self.lookup,
            cost_aware=self.cost_aware,
        )

    def __repr__(self) -> str:
        names = [type(m).__name__ for m in (self.draft_model, self.verifier_model) if m is not None]
        return (f"DynamicWindowAssistant(models={names}, max_window={self.max_window}, tau_init={self.tau_init}, "
                f"tau2_init={self.tau2_init}, lookup={self.lookup}, cost_aware={self.cost_aware})")


def _check_model(model, name: str) -> None:
    if not isinstance(model, PreTrainedModel) or not hasattr(model, "generate"):
        raise TypeError(f"{name} must be a transformers causal LM, got {type(model).__name__}.")
    if model.config.is_encoder_decoder:
        raise ValueError(f"{name} must be a decoder-only model.")


def _check_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}.")
    value = int(value)
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}.")
    return value
