"""Names that differ between the transformers releases hf_cascade supports, resolved once.

transformers 5.24 renamed the KV cache's keyword and output field from ``past_key_values`` to ``cache``
(model inputs, model outputs, ``generate``'s ``model_kwargs``), keeping the old name as a deprecated alias
(a warning, and a renaming decorator on every call) until 6.0. hf_cascade passes and reads the name the
model it calls declares, so no call of ours goes through the alias, and a model with remote code written
for either name works.

This module imports nothing of hf_cascade: the core and the drafters both use it.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from transformers.modeling_outputs import BaseModelOutputWithPast

#: The installed release's name for the cache: ``"cache"`` (5.24 on) or ``"past_key_values"``.
CACHE = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"
_NAMES = ("cache", "past_key_values")


@functools.cache
def _keyword_of(forward: Any) -> str:
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return CACHE
    for name in (CACHE, *_NAMES):
        if name in params:
            return name
    return CACHE


def cache_keyword(model: Any) -> str:
    """The keyword under which ``model``'s forward takes its KV cache (read once per class)."""
    return _keyword_of(type(model).forward)


def cache_kwargs(model: Any, cache: Any) -> dict:
    """``{<model's cache keyword>: cache, "use_cache": True}``: the keyword arguments of a cached forward."""
    return {cache_keyword(model): cache, "use_cache": True}


def output_cache(outputs: Any) -> Any:
    """The cache a model returned, whichever name its output class gives it (``None`` if none)."""
    for name in (CACHE, *_NAMES):
        value = outputs.get(name) if hasattr(outputs, "get") else getattr(outputs, name, None)
        if value is not None:
            return value
    return None


def given_cache(model_kwargs: dict) -> Any:
    """The cache in ``generate``'s ``model_kwargs`` (a user's, or the one ``generate`` prepared), or ``None``."""
    for name in (CACHE, *_NAMES):
        if model_kwargs.get(name) is not None:
            return model_kwargs[name]
    return None


__all__ = ["CACHE", "cache_keyword", "cache_kwargs", "given_cache", "output_cache"]
