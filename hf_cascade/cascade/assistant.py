"""``CascadeAssistant``: what users pass as ``generate(assistant_model=...)`` for CS Drafting."""

from __future__ import annotations

import os
from typing import Sequence

from torch.nn import Module
from transformers import PreTrainedModel

from ..assistant import LinearAssistant
from ..drafters.maxgram import MaxGram
from ..drafters.neural import MAX_VOCAB_PADDING, check_same_vocabulary, output_vocab_size
from ..loading import load_pretrained
from ..placement import place_like
from .drafter import CascadeCandidateGenerator
from .k_matrix import default_k_matrix, validate_k_matrix


class CascadeAssistant(LinearAssistant):
    """Cascade Speculative Drafting (Chen et al., 2024) for ``model.generate``.

    Args:
        drafters: largest first, e.g. ``[draft_model, MaxGram()]``. Neural drafters are HF causal
            LMs sharing the target's tokenizer, each given loaded or as a local directory or Hub repo id
            (loaded here by :func:`hf_cascade.loading.load_pretrained`); :class:`MaxGram` is the
            statistical bottom level.
            ``[MaxGram()]`` alone is prompt-lookup-style drafting; ``[draft_model]`` alone is
            classic speculative decoding.
        k_matrix: ``n x n`` upper-triangular draft counts (see :mod:`hf_cascade.cascade.k_matrix`);
            default: the paper's ``[[2, 10], [0, 10]]`` pattern.
        lenience: ``>= 1``; loosens reviews *between drafters* only (never the target's), so the
            output distribution is unchanged (§3.1).
        maxgram_lenience: ``>= 1``; lenience of a neural drafter's review of Max-Gram tokens
            (accepts a Max-Gram token when ``maxgram_lenience * p_drafter(token) >= 1``, under
            sampling with probability ``min(1, maxgram_lenience * p)``). Default 1 = none, as in
            the paper's App. B. Deviation: a small distilled drafter that is right on a minority of
            out-of-domain tokens (``docs/design.md``) vetoes many correct Max-Gram continuations; ``float("inf")`` lets
            Max-Gram's matches through unreviewed. Lossless at the target either way.
        min_confidence: a neural drafter stops contributing to the current draft after a token
            it gave probability ``< min_confidence`` (0 = never; transformers' assistants use 0.4
            the same way). Stop rules that only look at drawn tokens keep sampling lossless.
        keep_unsure: with ``min_confidence``, whether the unsure token itself stays in the draft
            (``True``, transformers' behaviour) or is dropped (``False``: the target then verifies
            only tokens the drafter was confident of, so when Max-Gram has no match and the drafter
            is unsure, the target runs a cheap one-token step). Lossless either way: under sampling a
            kept token's ``q`` is the drafter's distribution restricted to tokens at or above the floor.
        cost_aware: the smallest neural drafter's tokens for the target are admitted only while each
            raises the expected tokens per unit of target time (measured verification cost by draft
            length; the drafter's probability, calibrated online by the target's verdicts
            (:class:`~hf_cascade.core.payoff.AcceptanceCalibration`), as its acceptance
            estimate, Max-Gram's measured acceptance for the Max-Gram tokens before it): Max-Gram's
            adaptive-lookahead rule applied to the drafter, as a probability floor that drops the
            first token below it (the ``q`` handed to verification is restricted accordingly); the drafter
            is consulted at all only where its forwards' measured time is expected to pay
            (:class:`~hf_cascade.core.payoff.DrafterPayoff`). Default
            ``True``: a neural drafter then gets only the positions where it is expected to pay on the
            running machine, so adding one to Max-Gram does not slow it down; ``False``: the paper's fixed
            K-matrix lengths. Not in the paper; lossless. The calibration starts from ``a(p) = p`` at
            every ``generate()`` call.
        maxgram_first: with ``[..., MaxGram()]``: Max-Gram's proposal (``K[0][-1]`` tokens at most,
            adaptive length judged by the target's verdicts) goes to the target unreviewed, then the
            smallest neural drafter continues it autoregressively (``K[0]`` of that level, with
            ``min_confidence``); larger neural levels still review smaller ones. Deviation from the
            paper's largest-first horizontal order (``maxgram_first=False``), the default because a
            small distilled drafter reviewing Max-Gram's matches vetoes long correct ones whenever it is
            less often right than Max-Gram's match is (the shipped drafters' agreement with the target:
            ``docs/design.md``, *Training drafters*).
        tokenizer: optional tokenizer of the drafters, to check vocabularies exactly when
            ``generate(..., tokenizer=...)`` is also given.
        cpu_kernels: the verification backend switch (see :class:`~hf_cascade.assistant.Assistant`).
        revision, token, cache_dir, dtype, device_map: ``from_pretrained``'s options for the drafters given
            as paths or repo ids (``dtype`` / ``device_map`` with an already loaded drafter: ``ValueError``).
        place_drafters: at every ``generate()``, move each neural drafter to the device of the target's input
            embeddings and cast its float weights to their dtype (:func:`hf_cascade.placement.place_like`;
            a drafter dispatched with ``device_map`` stays put). ``False``: leave the drafters where they are
            (each reviews on its own device; tokens cross devices explicitly).

    Example::

        import hf_cascade
        out = model.generate(ids, assistant_model=hf_cascade.CascadeAssistant([MaxGram()]), max_new_tokens=128)
    """

    def __init__(
        self,
        drafters: Sequence[PreTrainedModel | MaxGram | str | os.PathLike],
        k_matrix: Sequence[Sequence[int]] | None = None,
        lenience: float = 1.0,
        tokenizer=None,
        maxgram_lenience: float = 1.0,
        min_confidence: float = 0.0,
        maxgram_first: bool = True,
        cpu_kernels: bool | None = None,
        keep_unsure: bool = True,
        cost_aware: bool = True,
        *,
        revision: str | None = None,
        token: str | bool | None = None,
        cache_dir: str | os.PathLike | None = None,
        dtype=None,
        device_map=None,
        place_drafters: bool = True,
    ):
        drafters = list(drafters)
        if not drafters:
            raise ValueError("CascadeAssistant needs at least one drafter, e.g. [MaxGram()].")
        hub = dict(revision=revision, token=token, cache_dir=cache_dir, dtype=dtype, device_map=device_map)
        drafters = [load_pretrained(d, kind=f"drafters[{i}]", **hub) if isinstance(d, (str, os.PathLike, Module)) else d
                    for i, d in enumerate(drafters)]
        for i, d in enumerate(drafters):
            if isinstance(d, MaxGram):
                if i != len(drafters) - 1:
                    raise ValueError("MaxGram must be the last (smallest) drafter of a cascade.")
            elif not isinstance(d, PreTrainedModel) or not hasattr(d, "generate"):
                raise TypeError(f"Drafter {i} must be a transformers causal LM or MaxGram (or the local path or Hub "
                                f"repo id of a causal LM), got {type(d).__name__}.")
        if lenience < 1.0 or maxgram_lenience < 1.0:
            raise ValueError(f"lenience and maxgram_lenience must be >= 1, got {lenience}, {maxgram_lenience}.")
        if not 0.0 <= min_confidence <= 1.0:
            raise ValueError(f"min_confidence must be in [0, 1], got {min_confidence}.")
        statistical = [isinstance(d, MaxGram) for d in drafters]
        self.drafters = drafters
        self.k_matrix = validate_k_matrix(k_matrix if k_matrix is not None else default_k_matrix(statistical), len(drafters))
        self.lenience = float(lenience)
        self.maxgram_lenience = float(maxgram_lenience)
        self.min_confidence = float(min_confidence)
        self.maxgram_first = bool(maxgram_first)
        self.keep_unsure = bool(keep_unsure)
        self.cost_aware = bool(cost_aware)
        self.tokenizer = tokenizer
        self.cpu_kernels = cpu_kernels
        self.place_drafters = bool(place_drafters)

    def bind(self, target) -> None:
        """Place the neural drafters on the target's input-embedding device and dtype (``place_drafters``)."""
        if self.place_drafters:
            for d in self.drafters:
                if not isinstance(d, MaxGram):
                    place_like(d, target)

    def build(self, target, generation_config, logits_processor, stats, target_tokenizer=None) -> CascadeCandidateGenerator:
        for d in self.drafters:
            if not isinstance(d, MaxGram):
                check_same_vocabulary(target, d, target_tokenizer, self.tokenizer)
            elif d.corpus is not None and abs(d.corpus.vocab_size - output_vocab_size(target)) > MAX_VOCAB_PADDING:
                raise ValueError(f"Vocabulary mismatch: the target predicts {output_vocab_size(target)} tokens, the "
                                 f"corpus n-grams were counted over {d.corpus.vocab_size}; count them over this target's outputs.")
        return CascadeCandidateGenerator(
            target, generation_config, logits_processor, stats, self.drafters, self.k_matrix, self.lenience,
            self.maxgram_lenience, self.min_confidence, self.maxgram_first, self.keep_unsure,
            self.cost_aware,
        )

    def __repr__(self) -> str:
        names = [type(d).__name__ for d in self.drafters]
        return f"CascadeAssistant(drafters={names}, k_matrix={self.k_matrix}, lenience={self.lenience})"
