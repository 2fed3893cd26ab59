"""hf_cascade: faster ``model.generate()`` with lossless speculative decoding.

``import hf_cascade`` installs a hook into transformers' assisted generation (see
:mod:`hf_cascade.hook`); then ``model.generate(ids, assistant_model=CascadeAssistant([...]))`` drafts
with our strategies and verifies with transformers' own loop.
"""

from . import hook as _hook
from .assistant import Assistant
from .auto import assistant_for
from .backends import VerifySession
from .cascade import CascadeAssistant
from .drafters import BigramTable, CorpusNGrams, CostModel, MaxGram
from .glide import GlideAssistant, GlideStats
from .hsddw import DynamicWindowAssistant, DynamicWindowStats
from .loading import load_pretrained
from .heads import CascadeDrafterConfig, CascadeDrafterForCausalLM, GlideConfig, GlideForCausalLM, ReDrafterConfig, ReDrafterModel, register_heads
from .processors import LossyLenientTarget, LossyTypicalAcceptance
from .redrafter import ReDrafterAssistant, ReDrafterStats
from .shipped_folders import shipped
from .drafters.recycling import RecyclingAssistant
from .core.stats import GenerationStats
from .core.budget import VerifyCost, measure_verify_cost

__version__ = "0.1.0"


def cpu_kernels(model):
    """``with hf_cascade.cpu_kernels(model): model.generate(...)``: plain decoding (or anything else) with
    hf_cascade's CPU kernels for a float32 model on CPU (see :mod:`hf_cascade.backends.cpu`)."""
    from .backends.cpu import cpu_kernels as _engage

    return _engage(model)


_hook.install()
register_heads()

__all__ = [
    "Assistant",
    "assistant_for",
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
    "RecyclingAssistant",
    "VerifyCost",
    "VerifySession",
    "cpu_kernels",
    "load_pretrained",
    "measure_verify_cost",
    "shipped",
]
