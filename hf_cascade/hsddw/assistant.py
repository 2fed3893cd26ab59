"""``DynamicWindowAssistant``: what users pass as ``generate(assistant_model=...)`` for HSDDW."""

from __future__ import annotations

import os

from transformers import PreTrainedModel

from ..assistant import LinearAssistant
from ..core.payoff import DraftPolicy
from ..drafters.neural import check_same_vocabulary
from ..options import Loading, Policy, rejects_moved
from ..placement import place_like
from .drafter import DynamicWindowCandidateGenerator
from .settings import DynamicWindowSettings
from .stats import DynamicWindowStats


class DynamicWindowAssistant(LinearAssistant):
    """Hierarchical Speculative Decoding with Dynamic Window (HSDDW) for ``model.generate``.

    Args:
        draft_model: the fast draft model (``M_q1``); any HF causal LM sharing the target's tokenizer,
            loaded or as a local directory or Hub repo id (loaded here with ``loading``'s options).
        verifier_model: optional stronger draft model (``M_q2``, loaded or a path / repo id) that
            pre-verifies the fast model's tokens (Algorithm 2). Without it: SD + Self-verify (Algorithm 1).
        settings: the windows (:class:`~hf_cascade.hsddw.settings.DynamicWindowSettings`: ``max_window``,
            ``tau_init``, ``tau2_init``, ``max_target_window``); default: the paper's.
        policy: beyond the paper (:class:`~hf_cascade.options.Policy`), both on by default and lossless:
            ``lookup``: first ask Max-Gram prompt lookup (:class:`~hf_cascade.drafters.maxgram.MaxGram`, default
            settings) at every target step; when it proposes tokens (as many as its adaptive lookahead finds worth
            verifying, at most ``max_window``) they are the step's draft and the draft models do not run; it pays
            where the output copies the prompt (extraction, translation); its statistics are the last level,
            ``"maxgram"``. ``cost_aware``: the draft models draft a step only while they are expected to pay for
            their forwards and the rows they add to the target's step, as measured in the call
            (:class:`~hf_cascade.core.payoff.DrafterPayoff`); a step they would not pay for is a plain one, and
            every 8th such step drafts anyway, to keep measuring; the windows stay the paper's.
            ``Policy.paper()``: the paper's drafter at every step.
        cpu_kernels: the verification backend switch (see :class:`~hf_cascade.assistant.Assistant`).
        loading: :class:`~hf_cascade.options.Loading`: ``from_pretrained``'s options for the models given as paths
            or repo ids; whether both draft models are moved, at every ``generate()``, to the device of the target's
            input embeddings and cast to their dtype (``place``; a model dispatched with ``device_map`` stays put;
            ``False``: the pre-verifier reviews on its own device, tokens cross devices explicitly); the draft
            models' ``tokenizer``, for an exact vocabulary check when ``generate(..., tokenizer=...)`` is also
            given.

    After each call ``assistant.last_stats`` is a :class:`~hf_cascade.hsddw.DynamicWindowStats`:
    window per step, redundancy sigma, target utilisation eta, tau trajectories, calls per model.

    Example::

        import hf_cascade
        a = hf_cascade.DynamicWindowAssistant(small_model, verifier_model=medium_model)
        out = model.generate(ids, assistant_model=a, max_new_tokens=128)
        a.last_stats.window_per_step, a.last_stats.redundancy, a.last_stats.target_utilization
    """

    last_stats: DynamicWindowStats | None = None

    @rejects_moved(
        DynamicWindowSettings,
        "max_window",
        "tau_init",
        "tau2_init",
        "max_target_window",
        loading=True,
        policy=True,
        tokenizer="loading=Loading(tokenizer=...)",
    )
    def __init__(
        self,
        draft_model: PreTrainedModel | str | os.PathLike,
        verifier_model: PreTrainedModel | str | os.PathLike | None = None,
        *,
        settings: DynamicWindowSettings | None = None,
        policy: Policy | None = None,
        cpu_kernels: bool | None = None,
        loading: Loading | None = None,
    ):
        self.settings, self.policy = DynamicWindowSettings.of(settings), Policy.of(policy)
        self.loading = Loading.of(loading)
        paths = [os.fspath(m) if isinstance(m, (str, os.PathLike)) else m for m in (draft_model, verifier_model)]
        draft_model = self.loading.load(draft_model, "draft_model")
        if verifier_model is not None:  # the same path twice: one model (refused below)
            same = paths[0] == paths[1]
            verifier_model = draft_model if same else self.loading.load(verifier_model, "verifier_model")
        _check_model(draft_model, "draft_model")
        if verifier_model is not None:
            _check_model(verifier_model, "verifier_model")
            if verifier_model is draft_model:
                raise ValueError(
                    "verifier_model must be a different (stronger) model than draft_model; "
                    "for one draft model leave verifier_model=None (SD + Self-verify)."
                )
        if self.settings.max_target_window is not None and verifier_model is None:
            raise ValueError(
                "max_target_window only applies with a verifier_model; without one the window is max_window."
            )
        self.lookup, self.cost_aware = self.policy.lookup, self.policy.cost_aware
        self.draft_model = draft_model
        self.verifier_model = verifier_model
        self.cpu_kernels = cpu_kernels

    def bind(self, target) -> None:
        """Place the draft model and the pre-verifier on the target's input-embedding device and dtype
        (``loading.place``)."""
        if self.loading.place:
            for model in (self.draft_model, self.verifier_model):
                if model is not None and model is not target:
                    place_like(model, target)

    def new_stats(self) -> DynamicWindowStats:
        return DynamicWindowStats()

    def build(
        self, target, generation_config, logits_processor, stats, target_tokenizer=None
    ) -> DynamicWindowCandidateGenerator:
        for model in (self.draft_model, self.verifier_model):
            if model is target:
                raise ValueError("The target cannot be its own draft model or pre-verifier.")
            if model is not None:
                check_same_vocabulary(target, model, target_tokenizer, self.loading.tokenizer)
        s = self.settings
        return DynamicWindowCandidateGenerator(
            target,
            generation_config,
            logits_processor,
            stats,
            self.draft_model,
            self.verifier_model,
            s.max_window,
            s.target_window,
            s.tau_init,
            s.tau2_init,
            lookup=self.lookup,
            policy=DraftPolicy.of(self.policy),
            memory=self.memory,
        )

    def __repr__(self) -> str:
        names = [type(m).__name__ for m in (self.draft_model, self.verifier_model) if m is not None]
        s = self.settings
        return (
            f"DynamicWindowAssistant(models={names}, max_window={s.max_window}, tau_init={s.tau_init}, "
            f"tau2_init={s.tau2_init}, lookup={self.lookup}, cost_aware={self.cost_aware})"
        )


def _check_model(model, name: str) -> None:
    if not isinstance(model, PreTrainedModel) or not hasattr(model, "generate"):
        raise TypeError(f"{name} must be a transformers causal LM, got {type(model).__name__}.")
    if model.config.is_encoder_decoder:
        raise ValueError(f"{name} must be a decoder-only model.")
