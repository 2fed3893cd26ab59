"""Cascade Speculative Drafting (CS Drafting)."""

from .assistant import CascadeAssistant
from .drafter import CascadeCandidateGenerator
from .k_matrix import default_k_matrix, validate_k_matrix
from .settings import CascadeSettings

__all__ = ["CascadeAssistant", "CascadeCandidateGenerator", "CascadeSettings", "default_k_matrix", "validate_k_matrix"]
