"""``DynamicWindowAssistant``: what users pass as ``generate(assistant_model=...)`` for HSDDW."""

from __future__ import annotations

import numbers

from transformers import PreTrainedModel

from ..assistant import Assistant
from ..drafters.neural import check_same_vocabulary
from .generator import DynamicWindowCandidateGenerator
from .rules import check_threshold
from .stats import DynamicWindowStats

#: Default cap of the window the target verifies, in multiples of ``max_window`` (the authors' code
#: hands the accumulated tokens to the target once there are more than 50, with K = 10).
TARGET_WINDOW_FACTOR = 5


class DynamicWindowAssistant(Assistant):
    """Hierarchical Speculative Decoding with Dynamic Window (HSDDW) for ``model.generate``.

    Args:
        draft_model: the fast draft model (``M_q1``); any HF causal LM sharing the target's tokenizer.
        verifier_model: optional stronger draft model (``M_q2``) that pre-verifies the fast model's
            tokens (Algorithm 2). Without it: SD + Self-verify (Algorithm 1).
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
        fast_head: run the target's verification forwards with the CPU kernels of
            :mod:`hf_cascade.verify_linear` and :mod:`hf_cascade.verify_head`; ``False`` leaves the target untouched.

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
        draft_model: PreTrainedModel,
        verifier_model: PreTrainedModel | None = None,
        max_window: int = 10,
        tau_init: float = 0.0,
        tau2_init: float = 0.0,
        max_target_window: int | None = None,
        tokenizer=None,
        fast_head: bool = True,
    ):
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
        self.fast_head = bool(fast_head)

    def candidate_generator(self, *args, **kwargs) -> DynamicWindowCandidateGenerator:
        generator = super().candidate_generator(*args, **kwargs)
        self.last_stats = generator.stats   # the DynamicWindowStats built in ``build``
        return generator

    def build(self, target, generation_config, logits_processor, stats, target_tokenizer=None) -> DynamicWindowCandidateGenerator:
        for model in (self.draft_model, self.verifier_model):
            if model is target:
                raise ValueError("The target cannot be its own draft model or pre-verifier.")
            if model is not None:
                check_same_vocabulary(target, model, target_tokenizer, self.tokenizer)
        return DynamicWindowCandidateGenerator(
            target, generation_config, logits_processor, DynamicWindowStats(), self.draft_model, self.verifier_model,
            self.max_window, self.max_target_window, self.tau_init, self.tau2_init,
        )

    def __repr__(self) -> str:
        names = [type(m).__name__ for m in (self.draft_model, self.verifier_model) if m is not None]
        return (f"DynamicWindowAssistant(models={names}, max_window={self.max_window}, tau_init={self.tau_init}, "
                f"tau2_init={self.tau2_init})")


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
