"""``hf-cascade bench --overhead``: the library's host cost per target call, where the forward is nearly free.

On a GPU a forward of a small or mid-size model costs about a millisecond once compiled; what is left per decoding
step is Python (transformers' loop, the assistant's drafting and acceptance) and every host-device sync. On a CPU the
slow forward hides that. This module measures that regime here: the tiny Llama of the tests
(:func:`~hf_cascade.bench.tiny.llama_target`, vocabulary 96, 2 layers, hidden 32), one thread, hf_cascade's CPU
kernels off (``cpu_kernels=False``), the drafting loops on their accelerator schedule
(:data:`hf_cascade.placement.DEFER_READS` ``= True``: draft ``k`` tokens on the device, read them once), greedy,
prompts on which the tiny target cycles (drafts get accepted). For plain ``generate``, transformers' prompt lookup
(``prompt_lookup_num_tokens=10``, the bench's ``pld``) and every strategy with its library defaults, per target call:

* **host ms**: wall time of ``generate`` minus the time inside the target's decoder forwards (a forward pre-hook and
  hook on ``target.get_decoder()``, which verification calls without the output head), over the target's decoder
  forwards; for plain decoding a target call is a token. Of it, the time inside the drafter's own forwards (a neural
  drafter, GLIDE's or ReDrafter's head; not modules shared with the target) is shown apart;
* **reads**: device-to-host reads (``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``bool(t)``, ``int(t)``,
  ``float(t)``, ``t.__index__``) counted by :class:`ReadCounter` from the target's first forward on, in a separate
  untimed run (the counter records call sites, which costs time): each is a sync on a GPU;
* **tokens per target call**, and host ms per call relative to plain's per token.

Also, as a baseline, plain ``generate`` compiled with a static cache (``cache_implementation="static"``,
``compile_config=CompileConfig()`` with ``_compile_all_devices = True`` so transformers compiles on CPU too): its
warm-up (the compile) apart, its wall time per token, and its host time outside the (compiled) forward. Where the
compile fails the row says so. With ``compiled_strategies`` (``--compiled-strategies``) every strategy also runs in
that regime, a row "<strategy>, compiled": the same assistant, ``cache_implementation="static"``, the same
``CompileConfig`` and ``max_cache_len``, so the decoding core verifies through its ``torch.compile``'d decoder
(the time inside it counts as target forward time); each such row is compared with compiled plain (host ms per call
over compiled plain's host ms per token, and the speedup of wall ms per token), the eager rows with plain
(:mod:`hf_cascade.bench.overhead_compiled`).

Each method runs one untimed warm-up, then ``repeats`` timed rounds over the prompts (methods interleaved in an order
rotated per prompt and round); per prompt the round with the least host time per target call counts (noise only
adds time). Every output, timed or counted, is compared with plain ``generate``'s.

The counters are :mod:`hf_cascade.bench.host_reads` (also what ``tests/test_host_reads.py`` counts with); the methods
and prompts :mod:`hf_cascade.bench.overhead_methods`; the compiled regime :mod:`hf_cascade.bench.overhead_compiled`;
the report :mod:`hf_cascade.bench.overhead_report`.
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from .calls import rotated
from .config import STRATEGIES
from .host_reads import READS, SCALAR_READS, ModuleTimer, ReadCounter, read_site
from .overhead_compiled import SUFFIX, draft_timer, graph_breaks, is_compiled, ratios, timed_compiled, unique_graphs
from .overhead_compiled import compiled_method as _compiled_method
from .overhead_compiled import compiled_strategies as _compiled_strategies
from .overhead_compiled import warm_up as _warm_up_compiled
from .overhead_methods import (
    COMPILED_LABEL,
    COMPILED_STRATEGY_LABEL,
    METHODS,
    PROMPT_TOKENS,
    REDRAFTER_STEPS,
    OverheadMethod,
    build_methods,
    overhead_prompts,
)
from .overhead_report import COMPILED, environment, load_average, markdown, write

# -- measuring ---------------------------------------------------------------------------------------------------


class _Settings:
    """Threads, CPU kernels and the drafting loops' read schedule for the measurement (restored on exit)."""

    def __init__(self, threads: int, defer_reads: bool):
        self.threads, self.defer_reads = threads, defer_reads

    def __enter__(self):
        from .. import placement
        from ..backends import ENV

        self._saved = (torch.get_num_threads(), placement.DEFER_READS, os.environ.get(ENV))
        torch.set_num_threads(self.threads)
        placement.DEFER_READS = self.defer_reads
        os.environ[ENV] = "0"
        return self

    def __exit__(self, *exc):
        from .. import placement
        from ..backends import ENV

        threads, defer, env = self._saved
        torch.set_num_threads(threads)
        placement.DEFER_READS = defer
        if env is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = env


def _inductor_cache() -> dict:
    """Where inductor caches compiled code on disk, and whether it held anything before this run (a warm cache
    shortens the compile)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        path = Path(cache_dir())
        return {"dir": str(path), "existed_before": path.is_dir() and any(path.iterdir())}
    except Exception as exc:  # private API: may move between torch versions
        return {"error": f"{type(exc).__name__}: {exc}"}


def measure_overhead(
    new_tokens: int = 128,
    prompts: int = 4,
    repeats: int = 3,
    threads: int = 1,
    compile: bool = True,
    compile_backend: str = "inductor",
    compile_mode: str | None = None,
    defer_reads: bool = True,
    methods: Sequence[str] | None = None,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
    compiled_strategies: bool = False,
) -> dict:
    """Measure every method (see the module docstring); returns the results as a dict (``results.json``).

    Args:
        new_tokens / prompts: tokens per prompt and how many prompts of :data:`PROMPT_TOKENS`.
        repeats: timed rounds over the prompts (per prompt the round with the least host time per call counts).
        threads: torch threads during the measurement (restored after).
        compile: also measure plain ``generate`` compiled with a static cache (``compile_backend``, ``compile_mode``:
            ``CompileConfig``'s ``backend`` and ``mode``; ``None``: its default).
        defer_reads: the drafting loops' accelerator schedule (:data:`hf_cascade.placement.DEFER_READS`).
        methods: a subset of :data:`METHODS` (``plain`` is always measured); default all.
        compiled_strategies: also each strategy of ``methods`` compiled (``"<name>-compiled"``,
            :mod:`hf_cascade.bench.overhead_compiled`); needs ``compile``.
    """
    from . import tiny

    say = log or (lambda msg: None)
    names = ["plain", *[m for m in (methods or METHODS) if m != "plain"]]
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown overhead method(s) {unknown}; choose from {', '.join(METHODS)}")
    if new_tokens < 1 or repeats < 1:
        raise ValueError("new_tokens and repeats must be >= 1")
    if compiled_strategies and not compile:
        raise ValueError("--compiled-strategies compares with compiled plain generate: drop --no-compile")
    inputs = overhead_prompts(prompts)
    with _Settings(threads, defer_reads):
        env = environment()
        target = tiny.llama_target()
        if "redrafter" in names:
            say("building the drafters of the tiny target (a ReDrafter head trains for a few seconds)")
        built = build_methods(target, names)
        with torch.inference_mode():
            return _measure(
                target,
                built,
                inputs,
                env,
                new_tokens,
                repeats,
                threads,
                compile,
                compile_backend,
                compile_mode,
                defer_reads,
                progress,
                say,
                compiled_strategies,
            )


def _measure(
    target,
    built: dict,
    inputs: list,
    env: dict,
    new_tokens: int,
    repeats: int,
    threads: int,
    compile: bool,
    compile_backend: str,
    compile_mode: str | None,
    defer_reads: bool,
    progress: bool,
    say,
    with_strategies: bool = False,
) -> dict:
    errors: dict[str, str] = {}
    compiled_info: dict = {}
    strategies_info: dict = {}
    cache_len = max(p.shape[1] for p in inputs) + new_tokens + 8  # one static cache size for every prompt
    if compile:
        method, _, settings = _compiled_method(target, compile_backend, compile_mode, cache_len)
        compiled_info = {"settings": settings}

    # warm-up: one untimed generate each (lazy imports, the verification cost profile measured once)
    warm = min(16, new_tokens)
    for name in list(built):
        try:
            built[name].run(inputs[0], warm)
        except Exception as exc:  # a method that breaks must not stop the others
            if name == "plain":
                raise
            errors[name] = f"{type(exc).__name__}: {exc}"
            del built[name]
    if compile:
        say(f"compiling plain generate with a static cache (backend {compile_backend})")
        if compile_backend == "inductor":
            compiled_info["inductor_cache"] = _inductor_cache()
        t0 = time.perf_counter()
        try:
            method.run(max(inputs, key=lambda p: p.shape[1]), new_tokens)  # the largest static cache first
            compiled_info["warmup_seconds"] = time.perf_counter() - t0
            compiled_info["compiled"] = getattr(method.model, "_compiled_call", None) is not None
            built[COMPILED] = method
        except Exception as exc:
            compiled_info["warmup_seconds"] = time.perf_counter() - t0
            compiled_info["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            errors[COMPILED] = compiled_info["error"]
            say(f"compiled plain generate failed: {compiled_info['error']}")
    if compile and with_strategies:
        extra = _compiled_strategies(
            {n: m for n, m in built.items() if n != COMPILED}, compile_backend, compile_mode, cache_len
        )
        strategies_info = _warm_up_compiled(extra, inputs, new_tokens, errors, say)
        built.update(extra)

    # timed rounds
    records: list[dict] = []
    reference: dict[int, torch.Tensor] = {}
    order = list(built)
    total = repeats * len(inputs) * len(order) + len(inputs) * len(order)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="overhead", unit="run")
    try:
        for r in range(repeats):
            for p, ids in enumerate(inputs):
                for name in rotated(order, p + r):
                    rec = _timed_run(built[name], name, ids, new_tokens, compiled=is_compiled(name))
                    rec.update(prompt=p, repeat=r)
                    if name == "plain" and p not in reference:
                        reference[p] = rec.pop("output")
                    records.append(rec)
                    if bar is not None:
                        bar.update()
        for rec in records:
            out = rec.pop("output", None)
            rec["identical"] = True if out is None else bool(torch.equal(out, reference[rec["prompt"]]))
        if strategies_info:
            strategies_info.update(graphs_after_timed=unique_graphs(), graph_breaks_after_timed=graph_breaks())
        # counted runs (untimed): reads and their call sites
        counts: dict[str, dict] = {}
        for name in order:
            counts[name] = _counted(built[name], inputs, new_tokens, reference, bar, compiled=is_compiled(name))
    finally:
        if bar is not None:
            bar.close()
    result = {
        "environment": env,
        "settings": {
            "new_tokens": new_tokens,
            "prompts": [p[0].tolist() for p in inputs],
            "repeats": repeats,
            "threads": threads,
            "cpu_kernels": False,
            "defer_reads": defer_reads,
            "greedy": True,
            "target": "hf_cascade.bench.tiny.llama_target() (vocab 96, 2 layers, hidden 32)",
            "drafter": "truncated_copy(target, 1) (cascade, HSDDW)",
            "glide": "echo_glide(target) (cross 0.3)",
            "redrafter": f"fit_head(target, steps={REDRAFTER_STEPS})",
            "cost_rules": "library defaults (Policy(): the measured VerifyCost, AdaptiveBudget, "
            "DrafterPayoff; nothing pinned)",
        },
        "methods": {},
        "errors": errors,
        "compiled": compiled_info,
        **({"compiled_strategies": strategies_info} if with_strategies else {}),
        "load_average_after": load_average(),
    }
    for name in order:
        result["methods"][name] = _summary(name, [r for r in records if r["method"] == name], counts[name])
        result["methods"][name]["drafter_timed"] = bool(built[name].draft_modules)
        if name.endswith(SUFFIX):
            result["methods"][name]["label"] = COMPILED_STRATEGY_LABEL.format(label=METHODS[name[: -len(SUFFIX)]])
            result["methods"][name]["compiled"] = strategies_info.get("compiled", {}).get(name)
    if COMPILED in result["methods"]:
        result["methods"][COMPILED]["label"] = COMPILED_LABEL.format(backend=compile_backend)
    ratios(result["methods"])  # host and wall time against plain (compiled strategies: compiled plain)
    return result


def _timed_run(method: OverheadMethod, name: str, ids, new_tokens: int, compiled: bool = False) -> dict:
    forward = ModuleTimer([method.model.get_decoder()])
    draft, compiled_drafts = draft_timer(method, compiled)
    with forward, draft, compiled_drafts, timed_compiled(method.model, forward, compiled):
        t0 = time.perf_counter()
        out = method.run(ids, new_tokens)
        wall = time.perf_counter() - t0
    new = out[0, ids.shape[1] :]
    return {
        "method": name,
        "wall_s": wall,
        "target_forward_s": forward.seconds,
        "target_calls": forward.calls,
        "draft_forward_s": draft.seconds,
        "draft_calls": draft.calls,
        "new_tokens": int(new.numel()),
        "host_s": wall - forward.seconds,
        "output": new.clone(),
    }


def _counted(method: OverheadMethod, inputs, new_tokens: int, reference, bar, compiled: bool = False) -> dict:
    """Reads per target call over every prompt (one untimed run each, from the target's first forward on), the
    reads before it, the call sites most frequent first, and whether the outputs equal plain's. Target calls are
    counted as in the timed runs (a compiled call's decoder hooks do not run: the calls are counted around it)."""
    reads = forwards = before = 0
    sites: collections.Counter = collections.Counter()
    identical = True
    error = None
    for p, ids in enumerate(inputs):
        try:
            calls = ModuleTimer([method.model.get_decoder()])
            with calls, timed_compiled(method.model, calls, compiled):
                with ReadCounter(method.model) as counter:
                    out = method.run(ids, new_tokens)
        except Exception as exc:  # e.g. a compiled graph that the wrappers make recompile
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            break
        finally:
            if bar is not None:
                bar.update()
        reads, forwards = reads + counter.reads, forwards + calls.calls
        before += counter.reads_before
        sites.update(counter.sites)
        identical &= bool(torch.equal(out[0, ids.shape[1] :], reference[p]))
    out = {
        "reads": reads,
        "forwards_seen": forwards,
        "reads_before_first_forward": before,
        "sites": sites.most_common(12),
        "identical": identical,
    }
    if error:
        out["error"] = error
    return out


def _summary(name: str, records: list[dict], counts: dict) -> dict:
    """Per prompt the round with the least host time per target call; totals over prompts."""

    def per_call(r: dict) -> float:
        return r["host_s"] / max(r["target_calls"], 1)

    best: dict[int, dict] = {}
    for r in records:
        if r["prompt"] not in best or per_call(r) < per_call(best[r["prompt"]]):
            best[r["prompt"]] = r
    chosen = list(best.values())
    wall = sum(r["wall_s"] for r in chosen)
    host = sum(r["host_s"] for r in chosen)
    fwd = sum(r["target_forward_s"] for r in chosen)
    draft = sum(r["draft_forward_s"] for r in chosen)
    calls = sum(r["target_calls"] for r in chosen)
    tokens = sum(r["new_tokens"] for r in chosen)
    median_host = sorted(map(per_call, records))[len(records) // 2] if records else None
    return {
        "label": METHODS.get(name, name),
        "prompts": len(chosen),
        "runs": len(records),
        "new_tokens": tokens,
        "target_calls": calls,
        "tokens_per_call": tokens / calls if calls else None,
        "host_ms_per_call": 1e3 * host / calls if calls else None,
        "host_ms_per_call_median_run": 1e3 * median_host if median_host is not None else None,
        "draft_forward_ms_per_call": 1e3 * draft / calls if calls else None,
        "target_forward_ms_per_call": 1e3 * fwd / calls if calls else None,
        "host_ms_per_token": 1e3 * host / tokens if tokens else None,
        "wall_ms_per_token": 1e3 * wall / tokens if tokens else None,
        "reads_per_call": counts["reads"] / counts["forwards_seen"] if counts.get("forwards_seen") else None,
        "reads": counts,
        "identical": all(r["identical"] for r in records) and counts.get("identical", False),
    }


def _chosen(args) -> list[str] | None:
    """The methods ``--strategy`` and ``--baselines`` name (the bench's names: ``glide`` is GLIDE + CAPE,
    ``glide-chain`` its chain); ``None`` (every method) when ``--strategy`` is not given."""
    if getattr(args, "strategy", None) is None:
        return None
    baselines = [b.strip() for b in (getattr(args, "baselines", None) or "").split(",") if b.strip()]
    unknown = [b for b in baselines if b not in METHODS]
    if unknown:
        raise ValueError(
            f"--baselines with --overhead: {', '.join(unknown)} not measured there; choose from "
            f"{', '.join(m for m in METHODS if m not in STRATEGIES)}"
        )
    return list(dict.fromkeys(["plain", *args.strategy.split(","), *baselines]))


def run(args, log: Callable[[str], None] = print) -> int:
    """``hf-cascade bench --overhead``: measure, write ``--out`` (default ``bench_overhead``), print the report."""
    prompts = 4
    if args.prompts is not None:
        try:
            prompts = int(args.prompts)
        except ValueError:
            raise ValueError(
                f"--prompts with --overhead is a number of prompts (1 to {len(PROMPT_TOKENS)}), got {args.prompts!r}"
            ) from None
    result = measure_overhead(
        new_tokens=args.new_tokens,
        prompts=prompts,
        repeats=args.repeats,
        threads=args.threads or 1,
        compile=not args.no_compile,
        methods=_chosen(args),
        compile_backend=args.compile_backend,
        progress=not args.no_progress,
        log=log,
        compiled_strategies=getattr(args, "compiled_strategies", False),
    )
    paths = write(result, args.out or "bench_overhead")
    print(markdown(result))
    print()
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}")
    return 0


__all__ = [
    "COMPILED",
    "METHODS",
    "PROMPT_TOKENS",
    "READS",
    "SCALAR_READS",
    "ModuleTimer",
    "OverheadMethod",
    "ReadCounter",
    "build_methods",
    "markdown",
    "measure_overhead",
    "overhead_prompts",
    "read_site",
    "run",
    "write",
]
