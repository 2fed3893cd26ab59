"""What the decoding core supports: clear errors, before the first forward, for everything else."""

from __future__ import annotations

import torch
from transformers import DynamicCache, GenerationConfig
from transformers.generation import GenerationMode

from ..compat import given_cache
from ..processors import DraftAwareProcessor
from .static import is_filled, is_static, static_rollback_supported

# model_kwargs that generate() prepares and the core may ignore
_IGNORED_KWARGS = {
    "attention_mask",
    "position_ids",
    "cache_position",
    "logits_to_keep",
    "past_key_values",
    "cache",
    "use_cache",
}


def check_supported(
    target,
    input_ids: torch.Tensor,
    generation_config: GenerationConfig,
    model_kwargs: dict,
    logits_processor=None,
    synced_gpus: bool = False,
    trees: bool = True,
    streamer=None,
    batch: bool = True,
) -> None:
    """Raise ``ValueError`` for inputs the core cannot honour. ``trees``: the strategy drafts token
    trees (lossy target rules review linear drafts only)."""
    cfg = generation_config
    batched = is_batched(input_ids, model_kwargs)
    if batched and not batch:
        raise ValueError(
            f"this loop supports one unpadded row only (got {input_ids.shape[0]} rows); the decoding core "
            "(the default loop) runs batches."
        )
    if batched:
        _check_batch(input_ids, cfg, model_kwargs, logits_processor, streamer)
    if (cfg.num_beams or 1) > 1:
        raise ValueError("hf_cascade assistants do not support beam search (num_beams > 1).")
    if target.config.is_encoder_decoder:
        raise ValueError("hf_cascade assistants support decoder-only targets only.")
    if not model_kwargs.get("use_cache", True):
        raise ValueError("hf_cascade assistants need use_cache=True (the target's KV cache holds the verified prefix).")
    if synced_gpus:
        raise ValueError("hf_cascade assistants do not support synced_gpus.")
    if cfg.return_dict_in_generate and (cfg.output_attentions or cfg.output_hidden_states):
        raise ValueError("hf_cascade assistants return sequences, scores and logits; not attentions or hidden states.")
    if getattr(cfg, "guidance_scale", None) not in (None, 1, 1.0):
        raise ValueError(
            "hf_cascade assistants do not support classifier-free guidance (guidance_scale): its "
            "processor runs its own unconditional forward per plain step."
        )
    if (getattr(cfg, "num_return_sequences", 1) or 1) > 1:
        raise ValueError("hf_cascade assistants support num_return_sequences=1 only.")
    if trees and any(isinstance(p, DraftAwareProcessor) for p in (logits_processor or [])):
        raise ValueError(
            "lossy target rules (LossyLenientTarget, LossyTypicalAcceptance) review linear drafts; "
            "tree assistants do not support them."
        )
    cache = given_cache(model_kwargs)
    static = is_static(cache) or cfg.cache_implementation == "static"
    if cache is not None and not isinstance(cache, DynamicCache) and not is_static(cache):
        raise ValueError(
            f"hf_cascade assistants need a DynamicCache or a StaticCache on the target (got {type(cache).__name__}): "
            "the decoding core keeps drafted rows in the cache and rolls rejected ones back; quantized and offloaded "
            "caches are not supported."
        )
    if static:
        _check_static()
    if isinstance(cache, DynamicCache) and cache.get_seq_length() > 0:
        raise ValueError("hf_cascade assistants start from the prompt: a prefilled cache is not supported.")
    if is_static(cache) and is_filled(cache):
        raise ValueError(
            "hf_cascade assistants start from the prompt: a filled StaticCache is not supported (pass a new one)."
        )
    positions = model_kwargs.get("position_ids")
    if (
        positions is not None
        and not batched
        and not torch.equal(positions.reshape(-1).cpu(), torch.arange(input_ids.shape[1]))
    ):
        raise ValueError("hf_cascade assistants do not support custom position_ids.")
    extra = sorted(k for k, v in model_kwargs.items() if v is not None and k not in _IGNORED_KWARGS)
    if extra:
        raise ValueError(f"hf_cascade assistants support token inputs only; unsupported model inputs: {extra}.")


def is_batched(input_ids: torch.Tensor, model_kwargs: dict) -> bool:
    """Whether the call runs the batched loop (:mod:`hf_cascade.core.batch`): several rows, or a padded one."""
    mask = model_kwargs.get("attention_mask")
    return input_ids.shape[0] > 1 or (mask is not None and not bool((mask != 0).all()))


def _check_static() -> None:
    if not static_rollback_supported():
        raise ValueError(
            "hf_cascade assistants need transformers >= 5 for a static cache (its static layers roll "
            "rejected drafts back); with this release, use the default dynamic cache."
        )


def _check_batch(input_ids, cfg, model_kwargs, logits_processor, streamer) -> None:
    mask = model_kwargs.get("attention_mask")
    if mask is not None:
        m = (mask != 0).long().cpu()
        if m.shape != input_ids.shape or bool((m[:, 1:] < m[:, :-1]).any()) or not bool(m[:, -1].all()):
            raise ValueError(
                "hf_cascade assistants need left padding for batches (each row's attention_mask: zeros, "
                "then ones to the end); set tokenizer.padding_side = 'left'."
            )
    if streamer is not None:
        raise ValueError("streamers support batch size 1 (as in transformers); stream one prompt at a time.")
    if any(isinstance(p, DraftAwareProcessor) for p in (logits_processor or [])):
        raise ValueError("lossy target rules (LossyLenientTarget, LossyTypicalAcceptance) support batch size 1 only.")


def refuse_unsupported_config(config: GenerationConfig) -> None:
    """Settings the assistants cannot honour, refused before transformers prepares the call (4.x
    would silently replace a static cache; beam search never reaches the assisted loop)."""
    if (config.num_beams or 1) > 1:
        raise ValueError("hf_cascade assistants do not support beam search (num_beams > 1).")
    other = [
        name
        for name in ("use_mtp", "prompt_lookup_num_tokens", "speculation_type", "assistant_early_exit")
        if getattr(config, name, None) not in (None, False)
    ]
    if other:
        raise ValueError(
            f"an hf_cascade assistant is the draft source of the call; transformers' own ({', '.join(other)}) "
            "cannot be combined with it: unset one of them."
        )
    mode = config.get_generation_mode()  # what the call asks for without an assistant
    if mode not in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE):
        # transformers lets an assistant silently override these modes; hf_cascade refuses them
        raise ValueError(
            f"hf_cascade assistants run greedy decoding and sampling; this call asks for {mode.value} "
            "(unset penalty_alpha, dola_layers, constraints / force_words_ids or num_beam_groups)."
        )
    if config.cache_implementation not in (None, "dynamic", "static"):
        raise ValueError(
            f"hf_cascade assistants run a dynamic or a static cache; cache_implementation="
            f"{config.cache_implementation!r} is not supported (the decoding core writes drafts into the cache and "
            "rolls rejected ones back)."
        )
    if config.cache_implementation == "static" and not static_rollback_supported():
        raise ValueError(
            "hf_cascade assistants need transformers >= 5 for a static cache (its static layers roll "
            "rejected drafts back); with this release, use the default dynamic cache."
        )


__all__ = ["check_supported", "is_batched", "refuse_unsupported_config"]
