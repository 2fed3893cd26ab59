"""The ``generate()`` hook: route ``assistant_model=<our assistant>`` to our candidate generators.

transformers has no public extension point for candidate generators, so :func:`install` wraps three
private functions, idempotently, binding their arguments by signature (parameter names, not
positions) so the wrappers survive signature changes across versions:

1. ``GenerationMixin._get_candidate_generator``: returns ``assistant.candidate_generator(...)``
   when ``assistant_model`` is a :class:`~hf_cascade.assistant.Assistant`; otherwise unchanged.
2. ``GenerationMixin._validate_generation_mode`` (5.x) / ``_validate_assistant`` (4.x): these
   compare the assistant's ``config`` with the target's; our assistants are checked by their own
   ``bind`` instead, so the assistant is hidden from that check.
3. ``GenerationMixin._assisted_decoding``: replaced by ``assistant.decode(...)``, the decoding core
   (:mod:`hf_cascade.core.loop`), with the same inputs and outputs. A
   :class:`~hf_cascade.assistant.LinearAssistant` with ``loop = "transformers"`` runs transformers'
   own loop instead, inside ``assistant.target_session(model)`` (the verification backend), with the
   candidate generator of 1.
4. ``transformers.pipelines.base.load_assistant_model``: lets ``pipeline(..., assistant_model=...)``
   accept our assistants (no tokenizer of their own), and builds the assistant of an hf_cascade checkpoint
   given as a loaded model, a path or a repo id (:mod:`hf_cascade.auto`).
5. ``GenerationMixin.generate``: ``assistant_model=<an hf_cascade checkpoint>`` (a GLIDE or ReDrafter head, a
   vanilla drafter) becomes the assistant made for it (:func:`hf_cascade.auto.assistant_for`).

Every other ``generate()`` call (plain, prompt lookup, an HF assistant model) is untouched.

Before wrapping anything, :func:`install` checks that each of these entry points exists with the parameters
its wrapper reads (:data:`ENTRY_POINTS`). A transformers release newer than the newest tested one keeps
working as long as they do; where one has moved, ``import hf_cascade`` fails with one ``ImportError`` naming
the supported range (:data:`SUPPORTED`) and what moved, and nothing is wrapped.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from transformers import GenerationConfig
from transformers.generation.utils import GenerationMixin

from .auto import assistant_for, checkpoint_kind
from .core.checks import refuse_unsupported_config

_MARK = "__hf_cascade_original__"

#: The transformers releases CI runs the whole contract on (the oldest supported and the newest).
TESTED = ("4.57.6", "5.25.0")
#: What pyproject.toml admits, in words, for error messages.
SUPPORTED = "transformers>=4.57,<6 (tested: 4.57.6 and 5.25.0)"


def _pipeline_base():
    try:
        from transformers.pipelines import base
    except ImportError:  # pragma: no cover - pipelines need optional deps in some installs
        return None
    return base


#: (owner, names tried in order, parameters the wrapper reads or passes on): the private entry points the hook
#: wraps and the shape it expects of them. ``owner`` is a callable returning the object (``None``: not installed).
ENTRY_POINTS = (
    (
        lambda: GenerationMixin,
        ("_get_candidate_generator",),
        ("self", "input_ids", "generation_config", "assistant_model", "model_kwargs"),
    ),
    (
        lambda: GenerationMixin,
        ("_assisted_decoding",),
        ("self", "input_ids", "generation_config", "assistant_model", "logits_processor", "stopping_criteria"),
    ),
    (lambda: GenerationMixin, ("_validate_generation_mode", "_validate_assistant"), ("generation_config",)),
    (lambda: GenerationMixin, ("generate",), ("self", "assistant_model")),
    (_pipeline_base, ("load_assistant_model",), ("assistant_model",)),
)


def check_entry_points() -> None:
    """Raise ``ImportError`` (one message naming :data:`SUPPORTED` and every entry point that moved) unless each
    entry point of :data:`ENTRY_POINTS` exists with the parameters its wrapper reads."""
    import transformers

    moved = []
    for owner_of, names, params in ENTRY_POINTS:
        owner = owner_of()
        if owner is None:
            continue
        found = [n for n in names if getattr(owner, n, None) is not None]
        if not found:
            moved.append(f"{getattr(owner, '__name__', owner)}.{names[0]} is gone")
            continue
        function = getattr(getattr(owner, found[0]), _MARK, getattr(owner, found[0]))
        try:
            have = inspect.signature(function).parameters
        except (TypeError, ValueError):
            moved.append(f"{found[0]} has no readable signature")
            continue
        missing = [p for p in params if p not in have]
        if missing:
            moved.append(f"{found[0]} no longer takes {', '.join(missing)}")
    if moved:
        raise ImportError(
            f"hf_cascade supports {SUPPORTED}; transformers {transformers.__version__} is installed and the "
            f"entry points hf_cascade hooks into have moved ({'; '.join(moved)}). Install a supported release, "
            f"e.g. pip install 'transformers=={TESTED[-1]}'."
        )


def _is_ours(obj: Any) -> bool:
    from .assistant import Assistant

    return isinstance(obj, Assistant)


def _wrap(owner: Any, name: str, make_wrapper: Callable[[Callable], Callable]) -> bool:
    """Replace ``owner.name`` by ``make_wrapper(original)`` once; return whether it exists."""
    current = getattr(owner, name, None)
    if current is None:
        return False
    if getattr(current, _MARK, None) is not None:
        return True  # already installed
    wrapper = functools.wraps(current)(make_wrapper(current))
    setattr(wrapper, _MARK, current)
    setattr(owner, name, wrapper)
    return True


def _when_ours(handle: Callable) -> Callable[[Callable], Callable]:
    """Wrapper factory: ``handle(assistant, arguments, original, args, kwargs)`` when the call's
    ``assistant_model`` is ours, the untouched ``original`` otherwise."""

    def make_wrapper(original: Callable) -> Callable:
        signature = inspect.signature(original)

        def wrapper(*args, **kwargs):
            arguments = signature.bind(*args, **kwargs).arguments
            assistant = arguments.get("assistant_model")
            if not _is_ours(assistant):
                return original(*args, **kwargs)
            return handle(assistant, arguments, original, args, kwargs)

        return wrapper

    return make_wrapper


@_when_ours
def _candidate_generator_wrapper(assistant, a, original, args, kwargs):
    return assistant.candidate_generator(
        target=a["self"],
        input_ids=a["input_ids"],
        generation_config=a["generation_config"],
        logits_processor=a.get("logits_processor"),
        model_kwargs=a.get("model_kwargs") or {},
        target_tokenizer=a.get("target_tokenizer"),
    )


@_when_ours
def _session_wrapper(assistant, a, original, args, kwargs):
    if getattr(assistant, "loop", "core") == "transformers":
        with assistant.target_session(a["self"]):
            output = original(*args, **kwargs)
        assistant.remember(a["input_ids"], output, a["generation_config"])
        return output
    return assistant.decode(
        target=a["self"],
        input_ids=a["input_ids"],
        logits_processor=a.get("logits_processor"),
        stopping_criteria=a.get("stopping_criteria"),
        generation_config=a["generation_config"],
        streamer=a.get("streamer"),
        synced_gpus=bool(a.get("synced_gpus", False)),
        model_kwargs=a.get("model_kwargs") or {},
        target_tokenizer=a.get("tokenizer"),
    )


def _pipeline_loader_wrapper(original: Callable) -> Callable:
    """Our assistants pass through; an hf_cascade checkpoint (model, path or repo id) becomes its assistant. A
    path or repo id is read with the ``token`` and ``cache_dir`` of the ``pipeline(...)`` call, not its
    ``revision`` (the model's; :mod:`hf_cascade.auto`)."""
    signature = inspect.signature(original)

    def wrapper(*args, **kwargs):
        import os

        from .auto import pipeline_hub_kwargs

        assistant = signature.bind(*args, **kwargs).arguments.get("assistant_model")
        if _is_ours(assistant):
            return assistant, None
        if assistant is not None:
            hub = pipeline_hub_kwargs() if isinstance(assistant, (str, os.PathLike)) else {}
            if checkpoint_kind(assistant, **hub) is not None:
                return assistant_for(assistant, **hub), None
        return original(*args, **kwargs)

    return wrapper


def _generate_wrapper(original: Callable) -> Callable:
    """``generate(assistant_model=<an hf_cascade checkpoint>)`` runs the checkpoint's assistant."""
    signature = inspect.signature(original)

    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        assistant = bound.arguments.get("assistant_model")
        if assistant is not None and not _is_ours(assistant) and checkpoint_kind(assistant) is not None:
            bound.arguments["assistant_model"] = assistant_for(assistant)
            return original(*bound.args, **bound.kwargs)
        return original(*args, **kwargs)

    return wrapper


def _hide_assistant_wrapper(original: Callable) -> Callable:
    """Call ``original`` as if no assistant had been given when the assistant is ours."""
    signature = inspect.signature(original)

    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        ours = False
        for pname, value in list(bound.arguments.items()):
            if pname == "assistant_model" and _is_ours(value):
                bound.arguments[pname], ours = None, True
            elif isinstance(value, dict) and _is_ours(value.get("assistant_model")):
                bound.arguments[pname], ours = {k: v for k, v in value.items() if k != "assistant_model"}, True
        if ours:
            # Beam search never asks for a candidate generator: refuse it here, where it is still visible.
            for value in bound.arguments.values():
                if isinstance(value, GenerationConfig):
                    refuse_unsupported_config(value)
        return original(*bound.args, **bound.kwargs)

    return wrapper


def install() -> None:
    """Install the hook (idempotent; called on ``import hf_cascade``); ``ImportError`` where the entry points
    have moved (:func:`check_entry_points`), before anything is wrapped."""
    check_entry_points()
    _wrap(GenerationMixin, "_get_candidate_generator", _candidate_generator_wrapper)
    _wrap(GenerationMixin, "_assisted_decoding", _session_wrapper)
    _wrap(GenerationMixin, "_validate_generation_mode", _hide_assistant_wrapper)
    _wrap(GenerationMixin, "_validate_assistant", _hide_assistant_wrapper)
    _wrap(GenerationMixin, "generate", _generate_wrapper)
    pipeline_base = _pipeline_base()
    if pipeline_base is not None:
        _wrap(pipeline_base, "load_assistant_model", _pipeline_loader_wrapper)


def uninstall() -> None:
    """Restore the original transformers functions (mainly for tests)."""
    from transformers.pipelines import base as pipeline_base

    for owner, name in [
        (GenerationMixin, "_get_candidate_generator"),
        (GenerationMixin, "_assisted_decoding"),
        (GenerationMixin, "_validate_generation_mode"),
        (GenerationMixin, "_validate_assistant"),
        (GenerationMixin, "generate"),
        (pipeline_base, "load_assistant_model"),
    ]:
        current = getattr(owner, name, None)
        original = getattr(current, _MARK, None)
        if original is not None:
            setattr(owner, name, original)
