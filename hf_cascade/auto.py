"""hf_cascade checkpoints given where transformers takes an assistant model.

A user who writes what transformers taught them, ``generate(ids, assistant_model=<model>)`` or
``pipeline(..., assistant_model="<repo id>")``, with an hf_cascade checkpoint gets the strategy the checkpoint
was made for, with its defaults:

======================== ==========================================================
``config.model_type``    assistant
======================== ==========================================================
``hf_cascade_glide``     :class:`~hf_cascade.glide.GlideAssistant` (head)
``hf_cascade_redrafter`` :class:`~hf_cascade.redrafter.ReDrafterAssistant` (head)
``hf_cascade_drafter``   :class:`~hf_cascade.cascade.CascadeAssistant` ``([drafter, MaxGram()])``
======================== ==========================================================

The checkpoint is recognised by its config's ``model_type`` (a loaded model, whichever class loaded it, remote
code included, or a local path / Hub repo id whose config.json says so); any other model is left to
transformers. The assistant built for a loaded model is kept on it (one per model object), so its
``last_stats`` read as the assistant's do: ``hf_cascade.assistant_for(head).last_stats``.
"""

from __future__ import annotations

import os
from typing import Any

KINDS = {"hf_cascade_glide": "glide", "hf_cascade_redrafter": "redrafter", "hf_cascade_drafter": "cascade"}
_ATTRIBUTE = "_hf_cascade_assistant"


def checkpoint_kind(obj: Any) -> str | None:
    """``"glide"``, ``"redrafter"`` or ``"cascade"`` for an hf_cascade checkpoint (a loaded model, a local
    directory or a Hub repo id), else ``None`` (including a string that names no readable config)."""
    if isinstance(obj, (str, os.PathLike)):
        from transformers import PretrainedConfig

        try:
            config, _ = PretrainedConfig.get_config_dict(os.fspath(obj))
        except (OSError, ValueError):
            return None
        return KINDS.get(str(config.get("model_type")))
    return KINDS.get(str(getattr(getattr(obj, "config", None), "model_type", None)))


def assistant_for(checkpoint: Any):
    """The assistant of an hf_cascade checkpoint with its defaults (see the module docstring); a loaded model
    keeps its assistant for later calls. ``ValueError`` for anything else."""
    kind = checkpoint_kind(checkpoint)
    if kind is None:
        raise ValueError(f"{checkpoint!r} is not an hf_cascade checkpoint (config.model_type not one of {sorted(KINDS)}).")
    loaded = not isinstance(checkpoint, (str, os.PathLike))
    if loaded and getattr(checkpoint, _ATTRIBUTE, None) is not None:
        return getattr(checkpoint, _ATTRIBUTE)
    if kind == "glide":
        from .glide import GlideAssistant

        assistant = GlideAssistant(checkpoint)
    elif kind == "redrafter":
        from .redrafter import ReDrafterAssistant

        assistant = ReDrafterAssistant(checkpoint)
    else:
        from .cascade import CascadeAssistant
        from .drafters.maxgram import MaxGram

        assistant = CascadeAssistant([checkpoint, MaxGram()])
    if loaded:
        object.__setattr__(checkpoint, _ATTRIBUTE, assistant)     # not a submodule: no state_dict entry
    return assistant
