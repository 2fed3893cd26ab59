"""Token Recycling (Luo et al., 2024, "Turning Trash into Treasure: Accelerating Inference of Large Language Models
with Token Recycling"): the target's own earlier top-``k`` candidates, kept per token and walked as a token tree,
with the sequence's repeats as seeds; no draft model.

* :mod:`.candidates` -- :class:`RecycledCandidates` (the table), :class:`RecyclingShape`, the best-first expansion;
* :mod:`.drafter` -- :class:`TokenRecycling`, one call's drafting step (what it keeps, and its deviations from the
  paper);
* :mod:`.settings` -- :class:`RecyclingSettings` (the candidates, their seeds, ``hot_start``);
* :mod:`.assistant` -- :class:`RecyclingAssistant` (``generate(assistant_model=...)``).
"""

from .assistant import RecyclingAssistant
from .candidates import Expansion, RecycledCandidates, RecyclingShape
from .drafter import TokenRecycling
from .settings import RecyclingSettings

__all__ = [
    "Expansion",
    "RecycledCandidates",
    "RecyclingAssistant",
    "RecyclingSettings",
    "RecyclingShape",
    "TokenRecycling",
]
