"""ReDrafter (Cheng et al., 2024, "Recurrent Drafter for Fast Speculative Decoding in Large Language
Models"): beam search with a recurrent draft head over the target's last hidden state, candidates
deduplicated into a token tree (dynamic tree attention) and verified in one target forward.

* :mod:`.beam` -- :func:`beam_search` with the head, the packed / flat verification trees;
* :mod:`.drafter` -- :class:`ReDrafterDrafter`, one call's drafting step (beam search, pack, cost cut);
* :mod:`.assistant` -- :class:`ReDrafterAssistant` (``generate(assistant_model=...)``);
* :mod:`.settings`, :mod:`.stats`, :mod:`.checks` -- :class:`ReDrafterSettings` (the beams' shape),
  :class:`ReDrafterStats`, :func:`check_head_matches` (a head built for this target).

The head itself is :class:`hf_cascade.heads.ReDrafterModel`; it is trained by
:func:`hf_cascade.training.run_redrafter.train_redrafter`.
"""

from .assistant import ReDrafterAssistant
from .beam import beam_search, beams_tree, confident_prefix, flat_tree
from .checks import check_head_matches
from .drafter import ReDrafterDrafter
from .settings import ReDrafterSettings
from .stats import ReDrafterStats

__all__ = [
    "ReDrafterAssistant",
    "ReDrafterDrafter",
    "ReDrafterSettings",
    "ReDrafterStats",
    "beam_search",
    "beams_tree",
    "check_head_matches",
    "confident_prefix",
    "flat_tree",
]
