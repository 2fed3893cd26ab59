"""The "vanilla" drafter head: an independent small causal LM over a reduced (FR-Spec) vocabulary."""

from .configuration_cascade_drafter import CascadeDrafterConfig
from .modeling_cascade_drafter import CascadeDrafterForCausalLM

__all__ = ["CascadeDrafterConfig", "CascadeDrafterForCausalLM"]
