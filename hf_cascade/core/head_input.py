"""What the target's forward hands the core besides its logits, and how acceptance's rows are computed from it.

* :class:`HeadInput` -- the output head's input at each forward (the final hidden states), caught by a hook: the
  core runs the decoder alone and computes logits for the rows acceptance reads (:mod:`hf_cascade.core.rows`).
* :func:`screen_heads` -- where the verification backend's argmax screen replaces full rows (greedy argmax, or
  rows read through their top ``k``), and where it must not (processors, scores returned, soft-capped heads).
* :func:`input_device` -- where the target's input ids go.

Shared by the batch-1 loop (:mod:`hf_cascade.core.loop`) and the batched one (:mod:`hf_cascade.core.batch`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from transformers import PreTrainedModel

from ..processors import screen_top_k
from .forward import logit_cap
from .rows import HeadFn
from .strategy import TreeDrafter


def screen_heads(run, drafters: list[TreeDrafter], factory) -> Callable[[int], tuple[HeadFn, Callable | None]] | None:
    """Where the backend's screen (``factory``: rows per call, top-k or ``None`` -> a screen or ``None``) applies,
    a function of the rows per head call giving ``(head, argmax_head)`` for :class:`TreeRows`; else ``None``.

    Greedy, where nothing but the argmax of a row is read (no logits processor, drafters that do not read the
    rows): the core's head and the screen's argmax; where drafters read the rows only through their top ``k``
    (:attr:`TreeDrafter.rows_top_k`): the screen's top-``k`` rows as the head (their argmax is the full rows').
    Sampling, where the processed rows are functions of each row's top ``k`` raw logits alone
    (:func:`~hf_cascade.processors.screen_top_k`): the screen's top-``k`` rows as the head (the processed rows are
    the full rows'; a drafter reading them reads the full rows). Never with scores or logits returned, or a
    soft-capped head (capped logits can tie where raw ones do not)."""
    if (
        factory is None
        or run.head is None
        or getattr(run, "scores", None) is not None
        or getattr(run, "raw_logits", None) is not None
        or logit_cap(run.target)
    ):
        return None
    head = run.head
    readers = [getattr(d, "rows_top_k", None) for d in drafters if getattr(d, "reads_rows", False)]
    if not run.cfg.do_sample:
        if len(run.processors) or None in readers:
            return None
        if not readers:
            return lambda rows: (head, factory(rows))
    k = screen_top_k(run.processors) if run.cfg.do_sample else max(readers)
    if k is None:
        return None

    def heads(rows: int):
        screen = factory(rows, k)
        return (head, None) if screen is None else (partial(screen.top, k=k), None)

    return heads


def input_device(target, input_ids: torch.Tensor) -> torch.device:
    """Where the target's input ids go: its input embeddings' device (``meta`` when offloaded: then
    the device the ids came on)."""
    emb = target.get_input_embeddings() if hasattr(target, "get_input_embeddings") else None
    weight = getattr(emb, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.device.type != "meta":
        return weight.device
    return input_ids.device


class HeadInput:
    """Within the block, remembers the input of ``model``'s output head at each forward: the final
    hidden states ``[1, T, H]`` (``T`` = rows whose logits are computed)."""

    def __init__(self, model: PreTrainedModel):
        get = getattr(model, "get_output_embeddings", None)
        self.head = get() if get is not None else None
        self.value: torch.Tensor | None = None
        self._handle = None

    def _hook(self, module, args):
        self.value = args[0] if args else None

    def __enter__(self) -> HeadInput:
        if isinstance(self.head, torch.nn.Module):
            self._handle = self.head.register_forward_pre_hook(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()

    def rows(self) -> torch.Tensor | None:
        """The last forward's ``[T, H]`` head input (then forgotten), or ``None``."""
        value, self.value = self.value, None
        return value.reshape(-1, value.shape[-1]) if value is not None else None


__all__ = ["HeadInput", "input_device", "screen_heads"]
