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

A repo id is read with the download options given (``revision``, ``token``, ``cache_dir``: ``from_pretrained``'s).
``pipeline(..., assistant_model="<repo id>", token=..., model_kwargs={"cache_dir": ...})`` passes its ``token`` and
``cache_dir`` on to the checkpoint (:func:`pipeline_hub_kwargs`): they say how to reach files, not which ones.
Its ``revision`` is not: it names a branch, tag or commit of the *model*'s repo, and transformers' own
``load_assistant_model`` loads the assistant at its default revision too (it passes none of the call's options).
To pin a head's revision, build its assistant (``GlideAssistant("<repo id>", loading=Loading(revision=...))``) and
pass that.
"""

from __future__ import annotations

import os
import sys
from typing import Any

KINDS = {"hf_cascade_glide": "glide", "hf_cascade_redrafter": "redrafter", "hf_cascade_drafter": "cascade"}
_ATTRIBUTE = "_hf_cascade_assistant"


def _hub(revision, token, cache_dir) -> dict:
    kw = {"revision": revision, "token": token, "cache_dir": cache_dir}
    return {k: (os.fspath(v) if k == "cache_dir" else v) for k, v in kw.items() if v is not None}


def checkpoint_kind(
    obj: Any,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> str | None:
    """``"glide"``, ``"redrafter"`` or ``"cascade"`` for an hf_cascade checkpoint (a loaded model, a local
    directory or a Hub repo id, read with ``revision`` / ``token`` / ``cache_dir``), else ``None`` (including a
    string that names no readable config)."""
    if isinstance(obj, (str, os.PathLike)):
        from transformers import PretrainedConfig

        try:
            config, _ = PretrainedConfig.get_config_dict(os.fspath(obj), **_hub(revision, token, cache_dir))
        except (OSError, ValueError):
            return None
        return KINDS.get(str(config.get("model_type")))
    return KINDS.get(str(getattr(getattr(obj, "config", None), "model_type", None)))


def assistant_for(
    checkpoint: Any,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | os.PathLike | None = None,
):
    """The assistant of an hf_cascade checkpoint with its defaults (see the module docstring); a path or repo id
    loads with ``revision`` / ``token`` / ``cache_dir``; a loaded model keeps its assistant for later calls.
    ``ValueError`` for anything else."""
    loaded = not isinstance(checkpoint, (str, os.PathLike))
    hub = {} if loaded else _hub(revision, token, cache_dir)
    kind = checkpoint_kind(checkpoint, **hub)
    if kind is None:
        raise ValueError(
            f"{checkpoint!r} is not an hf_cascade checkpoint (config.model_type not one of {sorted(KINDS)})."
        )
    if loaded and getattr(checkpoint, _ATTRIBUTE, None) is not None:
        return getattr(checkpoint, _ATTRIBUTE)
    from .options import Loading

    loading = Loading(**hub)
    if kind == "glide":
        from .glide import GlideAssistant

        assistant = GlideAssistant(checkpoint, loading=loading)
    elif kind == "redrafter":
        from .redrafter import ReDrafterAssistant

        assistant = ReDrafterAssistant(checkpoint, loading=loading)
    else:
        from .cascade import CascadeAssistant
        from .drafters.maxgram import MaxGram

        assistant = CascadeAssistant([checkpoint, MaxGram()], loading=loading)
    if loaded:
        object.__setattr__(checkpoint, _ATTRIBUTE, assistant)  # not a submodule: no state_dict entry
    return assistant


def pipeline_hub_kwargs() -> dict:
    """``token`` and ``cache_dir`` of the ``transformers.pipeline(...)`` call being built (those given, from the
    call's ``token=`` and ``model_kwargs``), for loading the assistant it names by repo id; ``{}`` outside one.

    ``load_assistant_model``, where transformers loads a pipeline's assistant, is not given the call's options,
    so they are read from the frame of ``pipeline()`` up the stack. ``revision`` is left out on purpose: it
    applies to the pipeline's model (see the module docstring)."""
    frame = sys._getframe(1)
    try:
        while frame is not None:
            if frame.f_code.co_name == "pipeline" and frame.f_globals.get("__name__") == "transformers.pipelines":
                local = frame.f_locals
                model_kwargs = local.get("model_kwargs") or {}
                token = local.get("token")
                found = {
                    "token": model_kwargs.get("token") if token is None else token,
                    "cache_dir": model_kwargs.get("cache_dir"),
                }
                return {k: v for k, v in found.items() if v is not None}
            frame = frame.f_back
        return {}
    finally:
        del frame
