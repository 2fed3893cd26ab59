"""One call of a benchmark's method, as every sweep makes it: the shared ``generate`` keywords, a prompt encoded, the
methods' order on a prompt (rotated), one timed run. Shared by the single-prompt runs (:mod:`hf_cascade.bench.runner`),
the batched sweep (:mod:`hf_cascade.bench.batched`) and the overhead rounds (:mod:`hf_cascade.bench.overhead`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from ..placement import synchronize
from .config import BenchConfig
from .methods import Method


def rotated(names: Sequence[str], i: int) -> list[str]:
    """``names`` rotated left by ``i`` (the order methods run on prompt ``i``)."""
    names = list(names)
    if not names:
        return names
    k = i % len(names)
    return names[k:] + names[:k]


def generation_kwargs(config: BenchConfig, tokenizer: Any, max_new_tokens: int | None = None) -> dict:
    """``generate`` keyword arguments shared by every method."""
    kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens or config.max_new_tokens, "do_sample": config.sampling}
    if config.sampling:
        kwargs["temperature"] = config.temperature
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    if pad is not None:
        kwargs["pad_token_id"] = pad
    return kwargs


def encode(tokenizer: Any, prompt: dict, device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of one prompt dict (its ``input_ids`` or its ``prompt`` text), on ``device``
    (``None``: the CPU)."""
    if prompt.get("input_ids") is not None:
        ids = torch.as_tensor(prompt["input_ids"], dtype=torch.long, device=device).view(1, -1)
    else:
        ids = tokenizer(prompt["prompt"], return_tensors="pt").input_ids.to(device)
    return ids, torch.ones_like(ids)


def timed(
    method: Method, ids, mask, kwargs: dict, seed: int, devices: Sequence[torch.device] = ()
) -> tuple[torch.Tensor, dict | None, float]:
    """One run of ``method`` (its ``run``) from ``seed``, and its wall seconds; ``devices``: the accelerators the run
    computes on (:func:`~hf_cascade.placement.accelerators` of the target), synchronised before each clock read, so
    the time is the run's device work too, not its launches."""
    torch.manual_seed(seed)
    for device in devices:
        synchronize(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out, stats = method.run(ids, mask, kwargs)
    for device in devices:
        synchronize(device)
    return out, stats, time.perf_counter() - t0


__all__ = ["encode", "generation_kwargs", "rotated", "timed"]
