"""hf_cascade: faster ``model.generate()`` with lossless speculative decoding.

``import hf_cascade`` installs a hook into ``generate()`` and ``pipeline()`` (:mod:`hf_cascade.hook`) and registers
hf_cascade's heads with transformers' Auto classes. Then ``model.generate(ids, assistant_model=...)`` given an
hf_cascade assistant (``CascadeAssistant([MaxGram()])``, ``GlideAssistant(head)``, ...) or an hf_cascade checkpoint
(:mod:`hf_cascade.auto` builds its assistant) runs hf_cascade's decoding core instead of transformers' assisted
loop, with the same inputs and outputs; every other ``generate()`` call is untouched.

The core is one loop for every strategy, :func:`hf_cascade.core.loop.speculative_decode`. Per step: **draft** (the
assistant's per-call drafter proposes a token tree below the last verified token; a linear strategy's draft is a
tree with one path), **verify** (one target forward over the tree: a tree mask and per-node positions, plain
causal attention for a chain; the output head only on the rows acceptance reads), **accept** (greedy, or exact
speculative sampling), **update** (keep the accepted path's K/V, emit and stream the tokens, hand the drafter its
feedback). A static cache (``cache_implementation="static"`` or a user's ``StaticCache``) keeps the verified prefix in
fixed buffers and verifies compiled where transformers would compile the same call (:mod:`hf_cascade.core.static`).
Left-padded batches run the same steps over rows (:mod:`hf_cascade.core.batch`). A linear strategy can
also run in transformers' own assisted loop (``assistant.loop = "transformers"``). Strategies, options and the
layout: ``docs/design.md``.
"""

from . import hook as _hook
from .assistant import Assistant
from .auto import assistant_for
from .backends import VerifySession
from .cascade import CascadeAssistant, CascadeSettings
from .core.payoff import CostModel, VerifyCost
from .core.stats import GenerationStats
from .drafters import BigramTable, CorpusNGrams, MaxGram
from .glide import CapeSettings, GlideAssistant, GlideSettings, GlideStats
from .heads import (
    CascadeDrafterConfig,
    CascadeDrafterForCausalLM,
    GlideConfig,
    GlideForCausalLM,
    ReDrafterConfig,
    ReDrafterModel,
    register_heads,
)
from .hsddw import DynamicWindowAssistant, DynamicWindowSettings, DynamicWindowStats
from .loading import load_pretrained
from .measure import measure_verify_cost
from .options import Loading, Policy
from .processors import LossyLenientTarget, LossyTypicalAcceptance
from .recycling import RecyclingAssistant, RecyclingSettings, RecyclingShape
from .redrafter import ReDrafterAssistant, ReDrafterSettings, ReDrafterStats
from .shipped_folders import shipped

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
    "CapeSettings",
    "CorpusNGrams",
    "CascadeDrafterConfig",
    "CascadeDrafterForCausalLM",
    "CascadeAssistant",
    "CascadeSettings",
    "CostModel",
    "DynamicWindowAssistant",
    "DynamicWindowSettings",
    "DynamicWindowStats",
    "GenerationStats",
    "GlideAssistant",
    "GlideConfig",
    "GlideForCausalLM",
    "GlideSettings",
    "GlideStats",
    "Loading",
    "LossyLenientTarget",
    "LossyTypicalAcceptance",
    "MaxGram",
    "Policy",
    "ReDrafterAssistant",
    "ReDrafterConfig",
    "ReDrafterModel",
    "ReDrafterSettings",
    "ReDrafterStats",
    "RecyclingAssistant",
    "RecyclingSettings",
    "RecyclingShape",
    "VerifyCost",
    "VerifySession",
    "cpu_kernels",
    "load_pretrained",
    "measure_verify_cost",
    "shipped",
]
