"""Load drafters and heads given as a loaded model, a local directory or a Hugging Face Hub repo id.

One path for every assistant (``CascadeAssistant``, ``DynamicWindowAssistant``, ``GlideAssistant``,
``ReDrafterAssistant``) and for :func:`load_head`. Rules of :func:`load_pretrained`:

* A loaded model (an ``nn.Module``) is returned unchanged; ``dtype`` / ``device_map`` / ``max_memory`` given with
  one raise ``ValueError`` (they apply to checkpoints being loaded; move a loaded model with ``.to(...)``).
* A string or path names a local directory if one exists there, else a Hub repo id (``"org/name"``); the
  keywords ``revision``, ``token``, ``cache_dir``, ``local_files_only``, ``dtype``, ``device_map``, ``max_memory``
  are ``from_pretrained``'s own and are passed on to it (``HF_HUB_OFFLINE`` and the local Hub cache apply as
  for any ``from_pretrained``). ``torch_dtype`` is accepted as the older name of ``dtype``.
* A checkpoint whose ``config.json`` names one of hf_cascade's heads (``model_type`` ``hf_cascade_*``, see
  :data:`hf_cascade.heads.HEADS`) loads with hf_cascade's installed classes: the modeling files shipped in
  the repository (its ``auto_map`` remote code) are never downloaded or run, so ``trust_remote_code`` is not
  needed and is ignored. Any other checkpoint loads with ``AutoModelForCausalLM`` and ``trust_remote_code``
  is passed through.
* Loading is strict: a checkpoint whose tensors are missing or of the wrong shape for its config raises
  ``ValueError`` instead of leaving freshly initialised weights; for hf_cascade's heads unexpected tensors
  raise too.

:func:`resolve_file` finds one file (e.g. ``corpus.safetensors``) given a file, a directory or a repo id.
This module stands above :mod:`hf_cascade.heads` (it reads the heads' registry); :mod:`hf_cascade.heads.hub` saves them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from .heads import HEADS, register_heads

#: ``name`` or ``org/name`` (the Hub's repo id syntax).
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")

#: Options that only mean something for a checkpoint being loaded.
_PLACEMENT = ("dtype", "device_map", "max_memory")


def _hub_kwargs(revision, token, cache_dir, local_files_only) -> dict:
    kw = {"revision": revision, "token": token, "cache_dir": cache_dir, "local_files_only": local_files_only}
    return {k: (str(v) if k == "cache_dir" else v) for k, v in kw.items() if v is not None}


def _check_spec(spec, kind: str) -> str:
    """``spec`` as a string: an existing directory, or a well-formed repo id (else a clear error)."""
    text = os.fspath(spec)
    if os.path.isdir(text):
        return text
    if os.path.exists(text):
        raise ValueError(
            f"{kind} {text!r} is a file; give the directory of a checkpoint (config.json + weights) or a Hub repo id."
        )
    if isinstance(spec, Path) or not _REPO_ID.match(text) or text.count("/") > 1:
        raise FileNotFoundError(f"{kind} {text!r}: no such directory, and not a Hub repo id ('org/name').")
    return text


def _our_head(model_type) -> tuple[Any, Any] | None:
    """``(config class, model class)`` of the hf_cascade head with this ``model_type``, else ``None``."""
    register_heads()
    for config_cls, model_cls, _ in HEADS:
        if model_type == config_cls.model_type:
            return config_cls, model_cls
    return None


def load_pretrained(
    spec,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | os.PathLike | None = None,
    dtype=None,
    device_map=None,
    max_memory: dict | None = None,
    local_files_only: bool | None = None,
    trust_remote_code: bool | None = None,
    kind: str = "drafter",
    torch_dtype=None,
    output_loading_info: bool = False,
):
    """A drafter or head from ``spec``: a loaded model, a local directory or a Hub repo id (see the module
    docstring for the rules). ``kind`` names the argument in error messages (``"draft_model"``,
    ``"glide_model"``, ...). ``output_loading_info=True`` returns ``(model, info)`` as ``from_pretrained``
    does (not for a loaded model)."""
    if torch_dtype is not None:
        if dtype is not None and dtype != torch_dtype:
            raise ValueError(f"{kind}: dtype={dtype} and torch_dtype={torch_dtype} disagree; give dtype only.")
        dtype = torch_dtype
    if isinstance(spec, torch.nn.Module):
        given = [name for name, value in zip(_PLACEMENT, (dtype, device_map, max_memory)) if value is not None]
        if given:
            raise ValueError(
                f"{kind}: {' and '.join(given)} apply only to a {kind} given as a local path or Hub "
                f"repo id, and {type(spec).__name__} is already loaded; move it yourself "
                "(model.to(device, dtype)) or pass its path / repo id instead."
            )
        if output_loading_info:
            raise ValueError(f"{kind}: output_loading_info needs a path or repo id, not a loaded model.")
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(f"{kind} must be a model, a local directory or a Hub repo id, got {type(spec).__name__}.")
    path = _check_spec(spec, kind)
    hub = _hub_kwargs(revision, token, cache_dir, local_files_only)
    load = {k: v for k, v in zip(_PLACEMENT, (dtype, device_map, max_memory)) if v is not None}
    from transformers import PretrainedConfig

    try:
        config_dict, _ = PretrainedConfig.get_config_dict(path, **hub)
    except OSError as e:
        where = f" at revision {revision!r}" if revision else ""
        raise OSError(
            f"{kind} {path!r}{where}: no config.json found locally, in the Hub cache or on the Hub "
            f"(offline: HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '')!r}). {e}"
        ) from e
    head = _our_head(config_dict.get("model_type"))
    if head is not None:
        model, info = _load_head(head, path, hub, load)
    else:
        from transformers import AutoModelForCausalLM

        if trust_remote_code is not None:
            load["trust_remote_code"] = trust_remote_code
        model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, **hub, **load)
        _check_info(path, info, unexpected=False)
    return (model, info) if output_loading_info else model


def load_head(path: str | os.PathLike, **kw):
    """A head (or drafter) from a local directory or Hub repo id, strictly: :func:`load_pretrained` (hf_cascade's own
    classes, no remote code; missing, unexpected or wrongly shaped tensors raise ``ValueError`` instead of leaving
    freshly initialised weights). ``kw``: ``revision``, ``token``, ``cache_dir``, ``dtype``, ``device_map``,
    ``local_files_only``, ``output_loading_info``. The counterpart of :func:`hf_cascade.heads.hub.save_hub`."""
    if kw.get("ignore_mismatched_sizes"):
        raise ValueError("load_head never ignores mismatched sizes; use from_pretrained directly for that.")
    return load_pretrained(path, kind="head", **kw)


def _load_head(head, path: str, hub: dict, load: dict):
    """``model_cls.from_pretrained`` of an hf_cascade head, strictly (see :func:`_check_info`)."""
    config_cls, model_cls = head
    try:
        model, info = model_cls.from_pretrained(path, output_loading_info=True, **hub, **load)
    except RuntimeError as e:  # 4.x: "... size mismatch for ..."; 5.x: "You set `ignore_mismatched_sizes` ..."
        if "mismatch" in str(e) or "shape" in str(e):
            raise ValueError(
                f"Checkpoint {path} does not match its config.json: the tensor shapes in its safetensors "
                f"differ from those the config (hidden_size, draft_vocab_size, ...) implies"
                f"{_shape_report(head, path, hub)}. transformers said: {e}"
            ) from e
        raise
    _check_info(path, info, unexpected=True)
    return model, info


def _check_info(path, info: dict, unexpected: bool) -> None:
    """``ValueError`` when ``from_pretrained`` left tensors missing or mismatched (or, for ``unexpected``,
    the checkpoint has tensors the model does not use)."""
    keys = ("missing_keys", "mismatched_keys") + (("unexpected_keys",) if unexpected else ())
    problems = {k: list(info.get(k) or []) for k in keys}
    problems = {k: v for k, v in problems.items() if v}
    if problems or info.get("error_msgs"):
        detail = "; ".join(f"{k}: {v[:5]}{' ...' if len(v) > 5 else ''}" for k, v in problems.items())
        raise ValueError(
            f"Checkpoint {path} does not match its config.json ({detail or info.get('error_msgs')}); "
            "refusing to use a model with re-initialised weights."
        )


def _shape_report(head, path: str, hub: dict) -> str:
    """``": name ckpt [a, b] vs config [c, d], ..."`` for the first mismatched tensors (best effort)."""
    try:
        from safetensors import safe_open

        config_cls, model_cls = head
        config = config_cls.from_pretrained(path, **hub)
        with torch.device("meta"):
            model = model_cls(config)
        expected = {k: list(v.shape) for k, v in model.state_dict().items()}
        if os.path.isdir(path):
            files = sorted(Path(path).glob("*.safetensors"))
        else:
            files = [Path(resolve_file(path, "model.safetensors", **{**hub, "local_files_only": True}))]
        diffs = []
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    shape = list(f.get_slice(key).get_shape())
                    if key in expected and expected[key] != shape:
                        diffs.append(f"{key} ckpt {shape} vs config {expected[key]}")
        return (": " + ", ".join(diffs[:3]) + (f" (+{len(diffs) - 3} more)" if len(diffs) > 3 else "")) if diffs else ""
    except Exception:  # the report is a courtesy; the ValueError is raised regardless
        return ""


def resolve_file(
    spec: str | os.PathLike,
    filename: str,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool | None = None,
    kind: str = "file",
) -> Path:
    """The local path of a file given as ``spec``: the file itself, ``spec/filename`` for a local
    directory, or ``filename`` of the Hub repo ``spec`` (``huggingface_hub.hf_hub_download``: the local Hub
    cache first, ``HF_HUB_OFFLINE`` honoured)."""
    text = os.fspath(spec)
    if os.path.isfile(text):
        return Path(text)
    if os.path.isdir(text):
        file = Path(text) / filename
        if not file.is_file():
            raise FileNotFoundError(f"{kind}: {text} has no {filename} (pass filename= for another name).")
        return file
    if isinstance(spec, Path) or not _REPO_ID.match(text) or text.count("/") > 1:
        raise FileNotFoundError(f"{kind} {text!r}: no such file or directory, and not a Hub repo id ('org/name').")
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(text, filename, **_hub_kwargs(revision, token, cache_dir, local_files_only)))
    except Exception as e:  # EntryNotFound, RevisionNotFound, LocalEntryNotFound (offline), ...
        where = f" at revision {revision!r}" if revision else ""
        raise OSError(
            f"{kind}: could not get {filename} of the Hub repo {text!r}{where} ({type(e).__name__}: {e})"
        ) from e


__all__ = ["load_head", "load_pretrained", "resolve_file"]
