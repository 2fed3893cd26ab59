"""Counting the model forwards of the baselines that keep no statistics of their own, for the standardized
walltime improvement (:mod:`hf_cascade.bench.swi`).

* transformers' assisted loops (prompt lookup, assisted generation with a draft model):
  :class:`ForwardCounter` puts a forward pre-hook on the target and the draft model while the baseline runs
  (a few microseconds per forward; removed afterwards) and records the tokens of each forward;
  :func:`transformers_loop_stats` turns them into the statistics fields the SWI reads. The target runs
  one forward per iteration: the first over the prompt and the candidates, the next ones over the last
  emitted token and the candidates, so a forward of ``r`` tokens verified ``r - prompt`` (first) or
  ``r - 1`` draft nodes. transformers' assistant model runs one forward per drafted token (its own
  ``generate``), its first over the prompt.
* economize: its cost log records every model call (:func:`economize_stats`).
* hf_cascade's assistants fill :class:`~hf_cascade.GenerationStats` themselves; :func:`assistant_levels`
  names the model behind each of their levels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

#: A level whose model the bench cannot cost (any string stands for one): its forwards make the SWI unavailable.
UNKNOWN = "unknown"


def _tokens(args: tuple, kwargs: dict) -> int | None:
    """Tokens of one forward from its inputs (``input_ids`` or ``inputs_embeds``), ``None`` if neither."""
    ids = kwargs.get("input_ids")
    if ids is None and args and isinstance(args[0], torch.Tensor):
        ids = args[0]
    if isinstance(ids, torch.Tensor):
        return int(ids.shape[-1])
    embeds = kwargs.get("inputs_embeds")
    return int(embeds.shape[-2]) if isinstance(embeds, torch.Tensor) else None


class ForwardCounter:
    """``with ForwardCounter(target, draft) as c: ...``: ``c.tokens[i]`` lists the tokens of every forward of
    the ``i``-th module (``None`` where the inputs did not say)."""

    def __init__(self, *modules: torch.nn.Module):
        self.modules = modules
        self.tokens: list[list[int | None]] = [[] for _ in modules]
        self._handles: list = []

    def __enter__(self) -> ForwardCounter:
        for module, log in zip(self.modules, self.tokens):

            def hook(_module, args, kwargs, log=log):
                log.append(_tokens(args, kwargs))

            self._handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def transformers_loop_stats(
    target_tokens: Sequence[int | None],
    prompt_tokens: int,
    new_tokens: int,
    levels: Sequence[tuple[str, Sequence[int | None]]] = (),
) -> dict:
    """Statistics of one generation in transformers' assisted loop from the tokens of each target forward
    (``target_tokens``) and of each forward of every drafter level (``(name, tokens)``). Without token counts
    (a forward whose inputs did not say) ``draft_len_per_call`` is left out: no SWI."""
    calls = len(target_tokens)
    stats: dict[str, Any] = {
        "target_calls": calls,
        "prefill_calls": 0,  # the first verification runs the prompt
        "new_tokens": new_tokens,
        "tokens_per_target_call": new_tokens / calls if calls else 0.0,
        "counted_by": "forward hooks",
        "levels": [
            {"name": name, "forward_calls": len(t), "forward_tokens": sum(t) if all(x is not None for x in t) else None}
            for name, t in levels
        ],
    }
    if calls and all(t is not None for t in target_tokens) and target_tokens[0] >= prompt_tokens:
        stats["draft_len_per_call"] = [target_tokens[0] - prompt_tokens] + [max(t - 1, 0) for t in target_tokens[1:]]
    return stats


def economize_stats(result: Any) -> dict:
    """Statistics of one economize row (``DecodeResult``): every ``"exact"`` call of its cost log is a target
    forward (the first over the prompt, emitting the first token; then the last token and the drafts of a
    cycle), any other call a drafter forward (prompt lookup makes none); ``acceptance`` holds one
    ``(drafted, accepted)`` pair per cycle that verified drafts."""
    acc = [(int(d), int(a)) for d, a in result.acceptance]
    events = list(result.cost.events)
    exact = [e for e in events if e.kind == "exact"]
    other = [e for e in events if e.kind != "exact"]
    prompt, new_tokens = int(result.prompt_length), int(result.tokens.numel())
    calls = len(exact)
    stats: dict[str, Any] = {
        "target_calls": calls,
        "prefill_calls": 0,  # the prompt's forward emits the first token, as plain's
        "new_tokens": new_tokens,
        "tokens_per_target_call": new_tokens / calls if calls else 0.0,
        "acceptance_by_position": _position_counts(acc),
        "levels": [
            {
                "name": "economize drafter",
                "forward_calls": len(other),
                "forward_tokens": sum(int(e.tokens) for e in other),
            }
        ],
        "counted_by": "economize cost log",
    }
    if calls and exact[0].position == 0 and exact[0].tokens >= prompt:
        nodes = [int(exact[0].tokens) - prompt] + [max(int(e.tokens) - 1, 0) for e in exact[1:]]
        stats["draft_len_per_call"] = nodes
        drafted = [i for i, n in enumerate(nodes) if n > 0]
        if [d for d, _ in acc if d > 0] == [nodes[i] for i in drafted]:  # the cycles line up with the forwards
            accepted = [0] * calls
            for i, (_, a) in zip(drafted, [p for p in acc if p[0] > 0]):
                accepted[i] = a
            stats["accepted_per_call"] = accepted
    return stats


def _position_counts(pairs: list[tuple[int, int]]) -> dict:
    """``(drafted, accepted)`` pairs -> acceptance counts by draft position (as in ``GenerationStats``)."""
    width = max((d for d, _ in pairs), default=0)
    proposed, accepted = [0] * width, [0] * width
    for d, a in pairs:
        for i in range(d):
            proposed[i] += 1
            accepted[i] += int(i < a)
    return {"proposed": proposed, "accepted": accepted}


def assistant_levels(assistant: Any) -> list | None:
    """The model behind each level of an hf_cascade assistant's statistics, top first: a module, ``None`` for a
    statistical drafter (no forwards), or ``None`` as a whole for an assistant this function does not know."""
    from ..cascade import CascadeAssistant
    from ..drafters import MaxGram
    from ..glide import GlideAssistant
    from ..hsddw import DynamicWindowAssistant
    from ..maxgram_tree import MaxGramTreeAssistant
    from ..redrafter import ReDrafterAssistant

    if isinstance(assistant, CascadeAssistant):
        return [None if isinstance(d, MaxGram) else d for d in assistant.drafters]
    if isinstance(assistant, DynamicWindowAssistant):
        models = [m for m in (assistant.verifier_model, assistant.draft_model) if m is not None]
        return models + ([None] if assistant.lookup else [])  # Max-Gram's lookup: no forwards
    if isinstance(assistant, GlideAssistant):  # a lookup branch: a statistical level below
        return [assistant.glide] + ([None] if assistant.lookup else [])
    if isinstance(assistant, ReDrafterAssistant):
        return [assistant.head] + ([None] if assistant.lookup else [])
    if isinstance(assistant, MaxGramTreeAssistant):
        return []
    return None


__all__ = ["UNKNOWN", "ForwardCounter", "assistant_levels", "economize_stats", "transformers_loop_stats"]
