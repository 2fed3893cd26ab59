"""The ReDrafter head (Cheng et al., 2024): a recurrent draft head over the target's last hidden state."""

from .configuration_redrafter import ReDrafterConfig
from .modeling_redrafter import ReDrafterModel, ReDrafterOutput

__all__ = ["ReDrafterConfig", "ReDrafterModel", "ReDrafterOutput"]
