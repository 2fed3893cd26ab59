"""GLIDE with a CAPE (Du et al., ICML 2024, "GLIDE with a CAPE: A Low-Hassle Method to Accelerate Speculative
Decoding"): a draft model that cross-attends to the target's KV cache (GLIDE, Section 4.1) and
confidence-aware proposal expansion verified as a token tree (CAPE, Section 4.2, Appendix A).

* :mod:`.cape` -- :class:`CapeSettings` (the expansion-size function ``S(p)``), the expansion sets and the
  verification tree of an expanded proposal;
* :mod:`.drafter` -- :class:`GlideDrafter`, one call's drafting step (glimpse, main path, CAPE, cache crop);
* :mod:`.assistant` -- :class:`GlideAssistant` (``generate(assistant_model=...)``);
* :mod:`.settings`, :mod:`.stats`, :mod:`.checks` -- :class:`GlideSettings` (the draft's shape), :class:`GlideStats`,
  :func:`check_glide_matches` (a GLIDE built for this target).

The draft model itself is :class:`hf_cascade.heads.GlideForCausalLM`; it is trained by
:func:`hf_cascade.training.run_glide.train_glide`.
"""

from .assistant import GlideAssistant
from .cape import CapeSettings, cap_expansions, cape_tree, expanded_proposal, expansion_sets
from .checks import check_glide_matches
from .drafter import GlideDrafter
from .settings import GlideSettings
from .stats import GlideStats

__all__ = [
    "CapeSettings",
    "GlideAssistant",
    "GlideDrafter",
    "GlideSettings",
    "GlideStats",
    "cap_expansions",
    "cape_tree",
    "check_glide_matches",
    "expanded_proposal",
    "expansion_sets",
]
