"""``CascadeAssistant``: what users pass as ``generate(assistant_model=...)`` for CS Drafting."""

from __future__ import annotations

import os
from collections.abc import Sequence

from transformers import PreTrainedModel

from ..assistant import LinearAssistant
from ..core.payoff import DraftPolicy
from ..drafters.maxgram import MaxGram
from ..drafters.neural import MAX_VOCAB_PADDING, check_same_vocabulary, output_vocab_size
from ..options import Loading, Policy, rejects_moved
from ..placement import place_like
from .drafter import CascadeCandidateGenerator
from .k_matrix import default_k_matrix, validate_k_matrix
from .settings import CascadeSettings


class CascadeAssistant(LinearAssistant):
    """Cascade Speculative Drafting (Chen et al., 2024) for ``model.generate``.

    Args:
        drafters: largest first, e.g. ``[draft_model, MaxGram()]``. Neural drafters are HF causal
            LMs sharing the target's tokenizer, each given loaded or as a local directory or Hub repo id
            (loaded here with ``loading``'s options); :class:`MaxGram` is the statistical bottom level.
            ``[MaxGram()]`` alone is prompt-lookup-style drafting; ``[draft_model]`` alone is
            classic speculative decoding.
        settings: the cascade's own settings (:class:`~hf_cascade.cascade.settings.CascadeSettings`: ``k_matrix``,
            ``lenience``, ``maxgram_lenience``, ``min_confidence``, ``keep_unsure``); default: the paper's K-matrix
            pattern, no lenience.
        policy: beyond the paper (:class:`~hf_cascade.options.Policy`), both on by default and lossless:
            ``cost_aware``: the smallest neural drafter's tokens for the target are admitted only while each raises
            the expected tokens per unit of target time (measured verification cost by draft length; the drafter's
            probability, calibrated online by the target's verdicts
            (:class:`~hf_cascade.core.payoff.AcceptanceCalibration`), as its acceptance estimate, Max-Gram's
            measured acceptance for the Max-Gram tokens before it): Max-Gram's adaptive-lookahead rule applied to
            the drafter, as a probability floor that drops the first token below it (the ``q`` handed to
            verification is restricted accordingly); the drafter is consulted at all only where its forwards'
            measured time is expected to pay (:class:`~hf_cascade.core.payoff.DrafterPayoff`). A neural drafter
            then gets only the positions where it is expected to pay on the running machine, so adding one to
            Max-Gram does not slow it down; off: the paper's fixed K-matrix lengths. The calibration starts from
            ``a(p) = p`` at every ``generate()`` call. ``lookup``: with ``[..., MaxGram()]``, Max-Gram's proposal
            (``K[0][-1]`` tokens at most, adaptive length judged by the target's verdicts) goes to the target
            unreviewed, then the smallest neural drafter continues it autoregressively (``K[0]`` of that level,
            with ``min_confidence``); larger neural levels still review smaller ones. A deviation from the paper's
            largest-first horizontal order (``Policy.paper()``), because a small distilled drafter reviewing
            Max-Gram's matches vetoes long correct ones whenever it is less often right than Max-Gram's match is
            (the shipped drafters' agreement with the target: ``docs/design.md``, *Training drafters*).
        cpu_kernels: the verification backend switch (see :class:`~hf_cascade.assistant.Assistant`).
        loading: :class:`~hf_cascade.options.Loading`: ``from_pretrained``'s options for the drafters given as paths
            or repo ids; whether each neural drafter is moved, at every ``generate()``, to the device of the target's
            input embeddings and cast to their dtype (``place``; a drafter dispatched with ``device_map`` stays put;
            ``False``: each reviews on its own device, tokens cross devices explicitly); the drafters' ``tokenizer``,
            to check vocabularies exactly when ``generate(..., tokenizer=...)`` is also given.

    Example::

        import hf_cascade
        out = model.generate(ids, assistant_model=hf_cascade.CascadeAssistant([MaxGram()]), max_new_tokens=128)
    """

    @rejects_moved(
        CascadeSettings,
        "k_matrix",
        "lenience",
        "maxgram_lenience",
        "min_confidence",
        "keep_unsure",
        loading=True,
        policy=True,
        tokenizer="loading=Loading(tokenizer=...)",
    )
    def __init__(
        self,
        drafters: Sequence[PreTrainedModel | MaxGram | str | os.PathLike],
        *,
        settings: CascadeSettings | None = None,
        policy: Policy | None = None,
        cpu_kernels: bool | None = None,
        loading: Loading | None = None,
    ):
        drafters = list(drafters)
        if not drafters:
            raise ValueError("CascadeAssistant needs at least one drafter, e.g. [MaxGram()].")
        self.settings, self.policy, self.loading = CascadeSettings.of(settings), Policy.of(policy), Loading.of(loading)
        drafters = [self.loading.load(d, f"drafters[{i}]") for i, d in enumerate(drafters)]
        for i, d in enumerate(drafters):
            if isinstance(d, MaxGram):
                if i != len(drafters) - 1:
                    raise ValueError("MaxGram must be the last (smallest) drafter of a cascade.")
            elif not isinstance(d, PreTrainedModel) or not hasattr(d, "generate"):
                raise TypeError(
                    f"Drafter {i} must be a transformers causal LM or MaxGram (or the local path or Hub "
                    f"repo id of a causal LM), got {type(d).__name__}."
                )
        statistical = [isinstance(d, MaxGram) for d in drafters]
        k_matrix = self.settings.k_matrix
        self.drafters = drafters
        self.k_matrix = validate_k_matrix(
            k_matrix if k_matrix is not None else default_k_matrix(statistical), len(drafters)
        )
        self.cpu_kernels = cpu_kernels

    @property
    def block_kind(self) -> str:
        """Max-Gram alone and a cascade with neural drafters draft differently: their steps are kept apart."""
        return f"CascadeAssistant/{len(self.drafters)} levels"

    def bind(self, target) -> None:
        """Place the neural drafters on the target's input-embedding device and dtype (``loading.place``)."""
        if self.loading.place:
            for d in self.drafters:
                if not isinstance(d, MaxGram):
                    place_like(d, target)

    def build(
        self, target, generation_config, logits_processor, stats, target_tokenizer=None
    ) -> CascadeCandidateGenerator:
        for d in self.drafters:
            if not isinstance(d, MaxGram):
                check_same_vocabulary(target, d, target_tokenizer, self.loading.tokenizer)
            elif d.corpus is not None and abs(d.corpus.vocab_size - output_vocab_size(target)) > MAX_VOCAB_PADDING:
                raise ValueError(
                    f"Vocabulary mismatch: the target predicts {output_vocab_size(target)} tokens, the "
                    f"corpus n-grams were counted over {d.corpus.vocab_size}; count them over this target's outputs."
                )
        s = self.settings
        return CascadeCandidateGenerator(
            target,
            generation_config,
            logits_processor,
            stats,
            self.drafters,
            self.k_matrix,
            s.lenience,
            s.maxgram_lenience,
            s.min_confidence,
            self.policy.lookup,
            s.keep_unsure,
            DraftPolicy.of(self.policy),
            self.memory,
        )

    def __repr__(self) -> str:
        names = [type(d).__name__ for d in self.drafters]
        return (
            f"CascadeAssistant(drafters={names}, k_matrix={self.k_matrix}, lenience={self.settings.lenience}, "
            f"policy={self.policy})"
        )
