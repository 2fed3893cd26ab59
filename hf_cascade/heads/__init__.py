"""Trainable drafter heads in Hugging Face Hub layout (``save_pretrained`` + remote code).

Each head lives in its own sub-package (``drafter/`` now; ``glide/`` and ``redrafter/`` later) made of
flat ``configuration_*.py`` / ``modeling_*.py`` files that import only torch and transformers, so a saved
checkpoint carries its code and loads with ``trust_remote_code=True`` where hf_cascade is not installed.
:func:`register_heads` (called by ``import hf_cascade``) registers every head with the Auto classes.
"""

from __future__ import annotations

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .drafter import CascadeDrafterConfig, CascadeDrafterForCausalLM
from .glide import GlideConfig, GlideForCausalLM, glide_cross_mask
from .redrafter import ReDrafterConfig, ReDrafterModel

# (config class, model class, Auto class of the model) for every head; add sibling heads here.
HEADS = [
    (CascadeDrafterConfig, CascadeDrafterForCausalLM, AutoModelForCausalLM),
    (GlideConfig, GlideForCausalLM, AutoModelForCausalLM),
    # Not a causal LM (it reads hidden states + embeddings): AutoModel, as in Apple's reference. Its
    # save_pretrained also names AutoModelForCausalLM in auto_map, the class hf_cascade.loading.load_head loads with.
    (ReDrafterConfig, ReDrafterModel, AutoModel),
]

_registered = False


def register_heads() -> None:
    """Register every head with ``AutoConfig`` / its Auto model class and mark it for ``auto_map``
    (so ``save_pretrained`` writes ``auto_map`` into config.json and copies the modeling files).
    Idempotent."""
    global _registered
    if _registered:
        return
    for config_cls, model_cls, auto_cls in HEADS:
        AutoConfig.register(config_cls.model_type, config_cls, exist_ok=True)
        auto_cls.register(config_cls, model_cls, exist_ok=True)
        config_cls.register_for_auto_class()
        model_cls.register_for_auto_class(auto_cls.__name__)
    _registered = True


__all__ = [
    "HEADS",
    "CascadeDrafterConfig",
    "CascadeDrafterForCausalLM",
    "GlideConfig",
    "GlideForCausalLM",
    "glide_cross_mask",
    "ReDrafterConfig",
    "ReDrafterModel",
    "register_heads",
]
