"""The GLIDE draft head (Du et al., ICML 2024): a small decoder that cross-attends to the target's KV cache."""

from .configuration_glide import GlideConfig
from .modeling_glide import GlideForCausalLM, glide_cross_mask

__all__ = ["GlideConfig", "GlideForCausalLM", "glide_cross_mask"]
