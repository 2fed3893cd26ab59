"""The compiled regime of ``hf-cascade bench --overhead`` (:mod:`hf_cascade.bench.overhead`).

* **compiled plain** (:func:`compiled_method`): plain ``generate`` on a copy of the target with a static cache and
  transformers' automatic compile (``cache_implementation="static"``, ``CompileConfig(backend=...)`` with
  ``_compile_all_devices = True`` so it compiles on a CPU too, one ``max_cache_len`` for every prompt). transformers
  keeps the compiled forward in ``model._compiled_call``; :class:`TimedCompiledCall` times the calls into it.
* **compiled strategies** (:func:`compiled_strategies`, ``--compiled-strategies``): each strategy's method with the
  same assistant, the same ``CompileConfig`` and ``max_cache_len`` and ``cache_implementation="static"``: the
  decoding core then verifies through the target's decoder compiled by ``torch.compile``
  (:mod:`hf_cascade.core.compiled`, kept in ``_COMPILED[decoder]``; the CPU kernels are off for such calls anyway).
  :class:`TimedCompiledDecoder` times the calls into that compiled decoder. transformers' prompt lookup (``pld``)
  has no compiled row: it is not an hf_cascade strategy.

Forward hooks on the decoder are not a reliable clock inside a compiled graph, so both wrappers mark the time inside
the compiled callable as target forward time by hand (:meth:`~hf_cascade.bench.host_reads.ModuleTimer.enter` /
``exit``; a decoder hook that does run inside is nested and not counted twice). A drafter model whose forwards a
compiled call compiles too (:func:`~hf_cascade.core.compiled.compiled_draft`) is timed the same way
(:class:`TimedCompiledDrafts`), without hooks: a hook on a module inside a compiled graph would recompile it.

A compiled strategy's row is compared with compiled plain: its host time per target call over compiled plain's host
time per token, its wall time per token against compiled plain's (:func:`ratios`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from .host_reads import ModuleTimer
from .overhead_methods import OverheadMethod
from .overhead_report import COMPILED

#: a compiled strategy's name in the results: ``"<strategy>-compiled"``
SUFFIX = "-compiled"


def compile_config(backend: str, mode: str | None):
    """The baseline's ``CompileConfig(backend=..., mode=...)`` with ``_compile_all_devices = True``."""
    from transformers import CompileConfig

    config = CompileConfig(backend=backend, **({"mode": mode} if mode else {}))
    config._compile_all_devices = True
    return config


def _sized(max_cache_len: int) -> dict:
    """``max_cache_len`` where generate takes it (5.x); 4.57 sizes the cache by the call's max_length."""
    from transformers import GenerationConfig

    return {"max_cache_len": max_cache_len} if hasattr(GenerationConfig(), "max_cache_len") else {}


def compiled_method(target, backend: str, mode: str | None, max_cache_len: int) -> tuple[OverheadMethod, Any, dict]:
    """Plain ``generate`` on a copy of ``target`` with a static cache and transformers' automatic compile; returns
    the method, the copy and the settings."""
    from .tiny import copy_model

    model = copy_model(target)
    config = compile_config(backend, mode)
    # one static cache length for every prompt (no recompile between them)
    sized = _sized(max_cache_len)
    settings = {"cache_implementation": "static", **sized, "compile_config": config.to_dict()}

    def run(ids, new):
        return model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=new,
            cache_implementation="static",
            compile_config=config,
            **sized,
        )

    return OverheadMethod(COMPILED, model, run), model, settings


def compiled_strategies(
    built: dict[str, OverheadMethod], backend: str, mode: str | None, max_cache_len: int
) -> dict[str, OverheadMethod]:
    """``"<strategy>-compiled"`` for every strategy in ``built``: its assistant and target, a static cache of
    ``max_cache_len``, the baseline's ``CompileConfig``."""
    config, sized = compile_config(backend, mode), _sized(max_cache_len)
    out = {}
    for name, method in built.items():
        if method.assistant is None:  # plain, transformers' prompt lookup
            continue

        def run(ids, new, model=method.model, assistant=method.assistant):
            return model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=new,
                assistant_model=assistant,
                cache_implementation="static",
                compile_config=config,
                **sized,
            )

        out[name + SUFFIX] = OverheadMethod(name + SUFFIX, method.model, run, method.draft_modules, method.assistant)
    return out


def is_compiled(name: str) -> bool:
    """Whether the method ``name`` runs compiled (compiled plain or a compiled strategy)."""
    return name == COMPILED or name.endswith(SUFFIX)


def decoder_compiled(model) -> bool:
    """Whether the core kept a compiled decoder for ``model`` (a compiled strategy's call did compile)."""
    from ..core.compiled import _COMPILED

    return model.get_decoder() in _COMPILED


def unique_graphs() -> int:
    """Graphs dynamo has captured in this process."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def graph_breaks() -> int:
    """Graph breaks dynamo has met in this process (the timers' hooks must not add any)."""
    from torch._dynamo.utils import counters

    return int(sum(counters["graph_break"].values()))


def _timed(inner, timer: ModuleTimer):
    def call(*args, **kwargs):
        timer.enter()
        try:
            return inner(*args, **kwargs)
        finally:
            timer.exit()

    call.__wrapped__ = inner
    return call


class TimedCompiledCall:
    """Wraps a model's compiled call (``model._compiled_call``, made by transformers' ``get_compiled_call``) so the
    time inside it counts as forward time of ``timer`` (decoder hooks do not run inside a compiled graph)."""

    def __init__(self, model, timer: ModuleTimer):
        self.model, self.timer = model, timer
        self.inner = getattr(model, "_compiled_call", None)

    def __enter__(self):
        if self.inner is not None:
            self.model._compiled_call = _timed(self.inner, self.timer)
        return self

    def __exit__(self, *exc):
        if self.inner is not None:
            self.model._compiled_call = self.inner


def draft_timer(method: OverheadMethod, compiled: bool) -> tuple[ModuleTimer, contextlib.AbstractContextManager]:
    """The timer of ``method``'s drafter forwards and what times them: forward hooks on its draft modules, but for
    those whose forwards a compiled run compiled (:class:`TimedCompiledDrafts`)."""
    from ..core.compiled import _DRAFTS

    kept = [m for m in method.draft_modules if compiled and _DRAFTS.get(m)]
    timer = ModuleTimer([m for m in method.draft_modules if not any(m is k for k in kept)])
    return timer, (TimedCompiledDrafts(kept, timer) if kept else contextlib.nullcontext())


class TimedCompiledDrafts:
    """Wraps the compiled draft forwards kept for ``modules`` (``hf_cascade.core.compiled._DRAFTS``) so the time
    inside them counts as drafter forward time of ``timer``; the kept entries are restored on exit. A call starting
    inside the block takes the wrappers (``compiled_draft`` returns the kept callable)."""

    def __init__(self, modules, timer: ModuleTimer):
        from ..core.compiled import _DRAFTS

        self.timer = timer
        self.entries = [(_DRAFTS[m], dict(_DRAFTS[m])) for m in modules]

    def __enter__(self):
        for kept, entries in self.entries:
            for name, (options, inner) in entries.items():
                kept[name] = (options, _timed(inner, self.timer))
        return self

    def __exit__(self, *exc):
        for kept, entries in self.entries:
            kept.update(entries)


class TimedCompiledDecoder:
    """Wraps the core's compiled decoder of ``model`` (``hf_cascade.core.compiled._COMPILED[decoder]``, kept
    across calls) so the time inside it counts as forward time of ``timer``; the kept entry is restored on exit.
    A call starting inside the block takes the wrapper (``compiled_decoder`` returns the kept callable)."""

    def __init__(self, model, timer: ModuleTimer):
        from ..core.compiled import _COMPILED

        self.kept, self.decoder, self.timer = _COMPILED, model.get_decoder(), timer
        self.entry = _COMPILED.get(self.decoder)

    def __enter__(self):
        if self.entry is not None:
            options, inner = self.entry
            self.kept[self.decoder] = (options, _timed(inner, self.timer))
        return self

    def __exit__(self, *exc):
        if self.entry is not None:
            self.kept[self.decoder] = self.entry


def timed_compiled(model, timer: ModuleTimer, compiled: bool = True):
    """Both wrappers (each a no-op where its compiled callable does not exist), or nothing unless ``compiled``."""
    if not compiled:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(TimedCompiledCall(model, timer))
    stack.enter_context(TimedCompiledDecoder(model, timer))
    return stack


def warm_up(methods: dict[str, OverheadMethod], inputs: list, new_tokens: int, errors: dict, say) -> dict:
    """One untimed run of every compiled strategy on every prompt (the compile, and every query shape the timed runs
    reach); a method that fails is removed and its error kept. Returns the record for ``results.json``."""
    import time

    info: dict = {"warmup_seconds": {}, "compiled": {}}
    if not methods:
        return info
    say(f"compiling the strategies' verification ({len(methods)} strategies)")
    for name in list(methods):
        t0 = time.perf_counter()
        try:
            for ids in inputs:
                methods[name].run(ids, new_tokens)
            info["compiled"][name] = decoder_compiled(methods[name].model)
        except Exception as exc:  # a method that breaks must not stop the others
            errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            del methods[name]
        info["warmup_seconds"][name] = time.perf_counter() - t0
    info["graphs_after_warmup"], info["graph_breaks_after_warmup"] = unique_graphs(), graph_breaks()
    return info


def ratios(methods: dict[str, dict]) -> None:
    """Each row's ``host_vs_plain`` and ``speedup`` (baseline wall ms per token over the row's) against its baseline
    (``baseline``): plain generate for eager rows and compiled plain; compiled plain for compiled strategies
    (``host_vs_plain`` then over compiled plain's host ms per token)."""
    plain, compiled = methods.get("plain"), methods.get(COMPILED)
    for name, s in methods.items():
        base_name = COMPILED if name.endswith(SUFFIX) else "plain"
        base = compiled if name.endswith(SUFFIX) else plain
        host = base and (base["host_ms_per_token"] if name.endswith(SUFFIX) else base["host_ms_per_call"])
        wall = base and base["wall_ms_per_token"]
        s["baseline"] = base_name
        s["host_vs_plain"] = s["host_ms_per_call"] / host if s["host_ms_per_call"] is not None and host else None
        s["speedup"] = wall / s["wall_ms_per_token"] if wall and s["wall_ms_per_token"] else None


__all__ = [
    "SUFFIX",
    "TimedCompiledCall",
    "TimedCompiledDecoder",
    "TimedCompiledDrafts",
    "compile_config",
    "compiled_method",
    "compiled_strategies",
    "decoder_compiled",
    "draft_timer",
    "graph_breaks",
    "is_compiled",
    "ratios",
    "timed_compiled",
    "unique_graphs",
    "warm_up",
]
