"""Whether a GLIDE was built for a target (vocabulary, attention geometry, layers): :func:`check_glide_matches`."""

from __future__ import annotations

from transformers import PreTrainedModel


def check_glide_matches(glide, target: PreTrainedModel) -> None:
    """``ValueError`` unless ``glide`` (a :class:`~hf_cascade.heads.GlideForCausalLM`) was built for
    ``target``'s vocabulary and attention geometry (query heads, head size, K/V heads, layers). Ties the shared
    embeddings when the GLIDE uses the target's. Devices may differ: K/V and embeddings move where used."""
    if not all(hasattr(glide, a) for a in ("target_kv", "tie_to_target", "to_draft_ids")):
        raise TypeError(f"glide_model must be a GlideForCausalLM (or the path of one), got {type(glide).__name__}")
    tc = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    c = glide.config
    if int(tc.vocab_size) != int(c.vocab_size):
        raise ValueError(
            f"this GLIDE predicts over a vocabulary of {c.vocab_size} ids, the target has "
            f"{tc.vocab_size}: it was built for another tokenizer."
        )
    kv_heads = int(getattr(tc, "num_key_value_heads", None) or tc.num_attention_heads)
    if c.target_num_key_value_heads is not None and int(c.target_num_key_value_heads) != kv_heads:
        raise ValueError(f"the target has {kv_heads} K/V heads, this GLIDE expects {c.target_num_key_value_heads}.")
    if c.target_num_hidden_layers is not None and int(c.target_num_hidden_layers) != int(tc.num_hidden_layers):
        raise ValueError(
            f"the target has {tc.num_hidden_layers} layers, this GLIDE was built for "
            f"{c.target_num_hidden_layers} (it would read the wrong layers' K/V)."
        )
    glide.tie_to_target(target)  # query heads, head size, layer ids; shared embeddings


__all__ = ["check_glide_matches"]
