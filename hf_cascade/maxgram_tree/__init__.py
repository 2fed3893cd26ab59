"""Max-Gram trees: prompt lookup (Max-Gram's suffix match, :mod:`hf_cascade.drafters.maxgram`) with up to
``branches`` distinct continuations merged into one token tree, verified in one target forward.

* :mod:`.drafter` -- :class:`MaxGramTree`, the continuations and their tree (stateless);
* :mod:`.assistant` -- :class:`MaxGramTreeAssistant` (``generate(assistant_model=...)``).
"""

from .assistant import MaxGramTreeAssistant
from .drafter import MaxGramTree

__all__ = ["MaxGramTree", "MaxGramTreeAssistant"]
