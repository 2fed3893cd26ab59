"""What ``hf-cascade bench --overhead`` (:mod:`hf_cascade.bench.overhead`) runs: the tiny target's prompts and the
methods measured on it (plain ``generate``, transformers' prompt lookup, every strategy with its defaults), each with
the modules that are its drafter's own (their forwards are drafting time, not the target's)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

# -- the tiny setting ------------------------------------------------------------------------------------------

#: Prompts on which the tiny Llama target's greedy output cycles (Max-Gram reaches 5.5-7 tokens per target call on
#: each), in order: the tests' REPETITIVE and CYCLE prompts first.
PROMPT_TOKENS: tuple[tuple[int, ...], ...] = (
    (1, 5, 6, 7, 5, 6, 7, 5, 6),
    (1, 9),
    (1, 15),
    (1, 22),
    (1, 31),
    (1, 53),
    (1, 62),
    (1, 77),
    (1, 84),
    (1, 92),
)
PLD_TOKENS = 10  # transformers' prompt lookup as the bench's ``pld`` baseline
REDRAFTER_STEPS = 80  # training steps of the ReDrafter head (as tests/test_host_reads.py)

#: method -> table label, in table order (``compiled`` and, with ``--compiled-strategies``, ``<method>-compiled``
#: after them, when measured).
METHODS = {
    "plain": "plain generate",
    "pld": f"transformers prompt lookup (prompt_lookup_num_tokens={PLD_TOKENS})",
    "maxgram": "Max-Gram: CascadeAssistant([MaxGram()])",
    "cascade": "cascade: CascadeAssistant([drafter, MaxGram()])",
    "hsddw": "HSDDW: DynamicWindowAssistant(drafter)",
    "glide": "GLIDE + CAPE: GlideAssistant(head)",
    "glide-chain": "GLIDE chain: GlideAssistant(head, settings=GlideSettings.chain())",
    "redrafter": "ReDrafter: ReDrafterAssistant(head)",
    "recycling": "Token Recycling: RecyclingAssistant()",
}
COMPILED_LABEL = 'plain, compiled: cache_implementation="static", CompileConfig(backend="{backend}")'
#: a compiled strategy's label: its eager label and this
COMPILED_STRATEGY_LABEL = "{label}, compiled (same static cache and CompileConfig)"


def overhead_prompts(n: int) -> list[torch.Tensor]:
    """The first ``n`` prompts of :data:`PROMPT_TOKENS` as ``[1, L]`` tensors."""
    if not 1 <= n <= len(PROMPT_TOKENS):
        raise ValueError(f"--prompts for --overhead is a number of prompts from 1 to {len(PROMPT_TOKENS)}, got {n}")
    return [torch.tensor([list(p)], dtype=torch.long) for p in PROMPT_TOKENS[:n]]


@dataclass
class OverheadMethod:
    """One way of calling ``generate``: ``run(input_ids, new_tokens) -> output ids`` with ``model`` as the target;
    ``draft_modules``: modules whose forwards are the drafter's (timed apart); ``assistant``: the strategy's
    assistant (``None`` for plain and prompt lookup; its compiled row reuses it)."""

    name: str
    model: Any
    run: Callable[[torch.Tensor, int], torch.Tensor]
    draft_modules: list = field(default_factory=list)
    assistant: Any = None


def _own_modules(modules: Iterable[torch.nn.Module], target) -> list:
    """``modules`` but those that are (or are inside) the target's (GLIDE shares the target's embeddings and head)."""
    shared = {id(m) for m in target.modules()}
    return [m for m in modules if m is not None and id(m) not in shared]


def build_methods(
    target, names: Sequence[str] | None = None, drafter=None, glide=None, redrafter=None
) -> dict[str, OverheadMethod]:
    """The methods ``names`` of :data:`METHODS` (default all) on ``target``, each assistant with its library defaults
    and ``cpu_kernels=False``; the drafters they need are built when not given: ``drafter`` (the target's first
    layer, :func:`~hf_cascade.bench.tiny.truncated_copy`), ``glide`` (:func:`~hf_cascade.bench.tiny.echo_glide`) and
    ``redrafter`` (:func:`~hf_cascade.bench.tiny.fit_head`, a few seconds of training)."""
    from .. import CascadeAssistant, DynamicWindowAssistant, GlideAssistant, GlideSettings, MaxGram, ReDrafterAssistant
    from ..recycling import RecyclingAssistant
    from . import tiny

    names = list(names or METHODS)
    if {"cascade", "hsddw"} & set(names) and drafter is None:
        drafter = tiny.truncated_copy(target, 1)
    if {"glide", "glide-chain"} & set(names) and glide is None:
        glide = tiny.echo_glide(target)
    if "redrafter" in names and redrafter is None:
        redrafter = tiny.fit_head(target, "overhead", steps=REDRAFTER_STEPS)

    def greedy(**extra):
        return lambda ids, new: target.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new, **extra
        )

    def ours(assistant):
        return lambda ids, new: target.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new, assistant_model=assistant
        )

    off = {"cpu_kernels": False}
    # name -> (assistant, the drafter's own modules); one assistant per method, reused by every call (as the bench's):
    # every strategy's state is per generate() call
    builders: dict[str, Callable[[], tuple]] = {
        "maxgram": lambda: (CascadeAssistant([MaxGram()], **off), []),
        "cascade": lambda: (CascadeAssistant([drafter, MaxGram()], **off), _model_modules(drafter, target)),
        "hsddw": lambda: (DynamicWindowAssistant(drafter, **off), _model_modules(drafter, target)),
        "glide": lambda: (GlideAssistant(glide, **off), _model_modules(glide, target)),
        "glide-chain": lambda: (
            GlideAssistant(glide, settings=GlideSettings.chain(), **off),
            _model_modules(glide, target),
        ),
        "redrafter": lambda: (
            ReDrafterAssistant(redrafter, **off),
            _own_modules([redrafter, *redrafter.children()], target),
        ),
        "recycling": lambda: (RecyclingAssistant(**off), []),
    }
    methods = {}
    for name in names:
        if name == "plain":
            methods[name] = OverheadMethod("plain", target, greedy())
        elif name == "pld":
            methods[name] = OverheadMethod("pld", target, greedy(prompt_lookup_num_tokens=PLD_TOKENS))
        elif name in builders:
            assistant, modules = builders[name]()
            methods[name] = OverheadMethod(name, target, ours(assistant), modules, assistant)
        else:
            raise ValueError(f"unknown overhead method {name!r}; choose from {', '.join(METHODS)}")
    return methods


def _model_modules(model, target) -> list:
    """A draft model's own modules a drafting loop may call: the model, its decoder, its output head; for a decoder
    the drafter steps through its modules (:class:`~hf_cascade.drafters.stepped.SteppedDecoder`, which a hook on the
    decoder turns off), those modules in its place: embedding, rotary embedding, layers, norm (the mask's and the
    positions' few ops between them then count as host time outside the drafter's forwards)."""
    from ..drafters.stepped import SteppedDecoder

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    decoder = model.get_decoder()
    stepped = SteppedDecoder.of(decoder)
    parts = [decoder] if stepped is None else [decoder.embed_tokens, decoder.rotary_emb, *stepped.layers, decoder.norm]
    return _own_modules([model, *parts, head], target)


__all__ = [
    "COMPILED_LABEL",
    "COMPILED_STRATEGY_LABEL",
    "METHODS",
    "PLD_TOKENS",
    "PROMPT_TOKENS",
    "REDRAFTER_STEPS",
    "OverheadMethod",
    "build_methods",
    "overhead_prompts",
]
