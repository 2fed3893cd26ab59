"""ReDrafter (Cheng et al., 2024, "Recurrent Drafter for Fast Speculative Decoding in Large Language
Models"): beam search with a recurrent draft head over the target's last hidden state, candidates
deduplicated into a token tree (dynamic tree attention) and verified in one target forward.

* :mod:`.beam` -- :func:`beam_search` with the head, the packed / flat verification trees;
* :mod:`.assistant` -- :class:`ReDrafterAssistant` (``generate(assistant_model=...)``) and its drafter.

The head itself is :class:`hf_cascade.heads.ReDrafterModel`; it is trained by
:func:`hf_cascade.training.run_redrafter.train_redrafter`.
"""

from .assistant import ReDrafterAssistant, ReDrafterDrafter, ReDrafterStats, check_head_matches
from .beam import beam_search, beams_tree, confident_prefix, flat_tree

__all__ = [
    "ReDrafterAssistant",
    "ReDrafterDrafter",
    "ReDrafterStats",
    "beam_search",
    "beams_tree",
    "check_head_matches",
    "confident_prefix",
    "flat_tree",
]
