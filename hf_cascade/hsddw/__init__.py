"""Hierarchical Speculative Decoding with Dynamic Window (HSDDW): entropy-based self-verify windows,
optionally with a stronger draft model that pre-verifies a fast one."""

from .assistant import DynamicWindowAssistant
from .drafter import DynamicWindowCandidateGenerator, draft_and_self_verify
from .rules import EntropyThreshold, entropy, self_verify_length
from .settings import DynamicWindowSettings
from .stats import DynamicWindowStats

__all__ = [
    "DynamicWindowAssistant",
    "DynamicWindowCandidateGenerator",
    "DynamicWindowSettings",
    "DynamicWindowStats",
    "EntropyThreshold",
    "draft_and_self_verify",
    "entropy",
    "self_verify_length",
]
