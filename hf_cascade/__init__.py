"""hf_cascade: faster ``model.generate()`` with lossless speculative decoding.

``import hf_cascade`` installs a hook into transformers' assisted generation (see
:mod:`hf_cascade.hook`); then ``model.generate(ids, assistant_model=CascadeAssistant([...]))`` drafts
with our strategies and verifies with transformers' own loop.
"""

from . import hook as _hook
from .assistant import Assistant
from .cascade import CascadeAssistant
from .drafters import BigramTable, CorpusNGrams, CostModel, MaxGram
from .glide import GlideAssistant, GlideStats
from .hsddw import DynamicWindowAssistant, DynamicWindowStats
from .heads import CascadeDrafterConfig, CascadeDrafterForCausalLM, GlideConfig, GlideForCausalLM, ReDrafterConfig, ReDrafterModel, register_heads
from .processors import LossyLenientTarget, LossyTypicalAcceptance
from .redrafter import ReDrafterAssistant, ReDrafterStats
from .stats import GenerationStats
from .tree.budget import VerifyCost, measure_verify_cost

__version__ = "0.1.0"

_hook.install()
register_heads()

__all__ = [
    "Assistant",
    "BigramTable",
    "CorpusNGrams",
    "CascadeDrafterConfig",
    "CascadeDrafterForCausalLM",
    "CascadeAssistant",
    "CostModel",
    "DynamicWindowAssistant",
    "DynamicWindowStats",
    "GenerationStats",
    "GlideAssistant",
    "GlideConfig",
    "GlideForCausalLM",
    "GlideStats",
    "LossyLenientTarget",
    "LossyTypicalAcceptance",
    "MaxGram",
    "ReDrafterAssistant",
    "ReDrafterConfig",
    "ReDrafterModel",
    "ReDrafterStats",
    "VerifyCost",
    "measure_verify_cost",
]
