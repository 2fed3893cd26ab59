"""SuffixDecoding (Oliaro et al., 2024, arXiv:2411.04975), a bench baseline: ArcticInference's suffix trees
(``pip install arctic-inference``, imported only when a :class:`SuffixAssistant` is built) driven as vLLM does, verified
in hf_cascade's decoding core.

* :mod:`.drafter` -- :class:`SuffixCandidateGenerator` (linear drafts) and :class:`SuffixTreeDrafter` (speculation
  trees): one ``generate()`` call as one request of the cache (how, and the deviations from vLLM);
* :mod:`.settings` -- :class:`SuffixSettings` (vLLM's defaults);
* :mod:`.assistant` -- :class:`SuffixAssistant` (``generate(assistant_model=...)``) and its cache.
"""

from .assistant import INSTALL, SuffixAssistant, suffix_cache_class
from .drafter import SuffixCandidateGenerator, SuffixTreeDrafter
from .settings import SuffixSettings

__all__ = [
    "INSTALL",
    "SuffixAssistant",
    "SuffixCandidateGenerator",
    "SuffixSettings",
    "SuffixTreeDrafter",
    "suffix_cache_class",
]
