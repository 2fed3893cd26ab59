"""Base class of the objects users pass as ``generate(assistant_model=...)``.

An :class:`Assistant` holds settings and (references to) drafter models; it builds a fresh
:class:`~hf_cascade.candidate.SpeculativeCandidateGenerator` for every ``generate()`` call (through
the hook in :mod:`hf_cascade.hook`) and exposes that call's statistics as :attr:`last_stats`.
"""

from __future__ import annotations

from contextlib import nullcontext

from transformers import DynamicCache, GenerationConfig, LogitsProcessorList, PreTrainedModel

from .candidate import SpeculativeCandidateGenerator
from .stats import GenerationStats
from .verify_linear import fast_verification


class Assistant:
    """Base of all hf_cascade assistants (``CascadeAssistant``, ...).

    ``fast_head``: during our assisted calls, run the target's multi-token verification forwards with
    the CPU kernels of :mod:`hf_cascade.verify_linear` (decoder linears) and :mod:`hf_cascade.verify_head`
    (output head, large vocabularies only); CPU, float32. ``False``: the model's own kernels. The
    kernels with a copy of the weight (the compiled ``panel`` kernel of :mod:`hf_cascade.panel`, built
    on first use; else oneDNN's packed one) keep that copy, of the same size, while the model lives
    (Gemma-3-270M: up to ~1.1 GB; ``hf_cascade.panel.PANEL.enabled = False`` and
    ``hf_cascade.kernels.PACKER.enabled = False`` avoid them).
    """

    last_stats: GenerationStats | None = None
    fast_head: bool = True

    def target_session(self, target: PreTrainedModel):
        """Context manager entered around one assisted ``generate()`` call."""
        return fast_verification(target) if self.fast_head else nullcontext(False)

    def candidate_generator(
        self,
        target: PreTrainedModel,
        input_ids,
        generation_config: GenerationConfig,
        logits_processor: LogitsProcessorList | None,
        model_kwargs: dict,
        target_tokenizer=None,
    ) -> SpeculativeCandidateGenerator:
        """Called by the hook once per ``generate()`` call (``target_tokenizer``: the ``tokenizer=``
        given to ``generate``, if any)."""
        self.check_supported(target, input_ids, generation_config, model_kwargs)
        stats = GenerationStats()
        generator = self.build(target, generation_config, logits_processor, stats, target_tokenizer)
        self.last_stats = stats
        return generator

    def build(self, target, generation_config, logits_processor, stats, target_tokenizer=None) -> SpeculativeCandidateGenerator:
        raise NotImplementedError

    @staticmethod
    def check_supported(target: PreTrainedModel, input_ids, generation_config: GenerationConfig, model_kwargs: dict) -> None:
        """Clear errors for what assisted generation with our assistants does not support."""
        if input_ids.shape[0] != 1:
            raise ValueError(f"hf_cascade assistants support batch size 1 only (got {input_ids.shape[0]}).")
        if (generation_config.num_beams or 1) > 1:
            raise ValueError("hf_cascade assistants do not support beam search (num_beams > 1).")
        if target.config.is_encoder_decoder:
            raise ValueError("hf_cascade assistants support decoder-only targets only.")
        cache = model_kwargs.get("past_key_values")
        if cache is not None and not isinstance(cache, DynamicCache):
            raise ValueError(
                f"hf_cascade assistants need a DynamicCache on the target (got {type(cache).__name__}); "
                "static and quantized caches cannot be rolled back."
            )
