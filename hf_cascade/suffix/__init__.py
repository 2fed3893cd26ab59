"""SuffixDecoding (Oliaro et al., 2024, arXiv:2411.04975), a bench baseline: ArcticInference's suffix trees
(``pip install arctic-inference``, imported only when a :class:`SuffixAssistant` is built) driven as vLLM does, verified
in hf_cascade's decoding core.

* :mod:`.drafter` -- :class:`SuffixCandidateGenerator` (linear drafts) and :class:`SuffixTreeDrafter` (speculation
  trees): one ``generate()`` call as one request of the cache (how, and the deviations from vLLM);
* :mod:`.assistant` -- :class:`SuffixAssistant` (``generate(assistant_model=...)``), its cache and vLLM's defaults.
"""

from .assistant import INSTALL, VLLM_DEFAULTS, SuffixAssistant, suffix_cache_class
from .drafter import SuffixCandidateGenerator, SuffixTreeDrafter

__all__ = ["INSTALL", "SuffixAssistant", "SuffixCandidateGenerator", "SuffixTreeDrafter", "VLLM_DEFAULTS",
           "suffix_cache_class"]
