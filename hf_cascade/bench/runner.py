"""The measurement loop: :func:`run_benchmark` returns a :class:`BenchResult` (data only, nothing printed).

Methods are interleaved prompt by prompt: for prompt ``i`` every method runs once, in the base order
rotated by ``i``, so slow drifts of the machine (thermal, other load) hit all methods alike. Prompts go to the
target's input device, and every timed call synchronises the target's accelerators before each clock read
(:func:`~hf_cascade.bench.calls.timed`). Each method first runs one untimed warm-up ``generate`` on the first prompt.
Then, before the timed runs, the cost tables of the standardized walltime improvement are built
(:func:`~hf_cascade.bench.costs.build_costs`; ``measured`` times the models), and every record gets its
``standardized_time`` per cost model (:mod:`hf_cascade.bench.swi`). With ``config.batch_sizes`` the batched sweep
follows, with the same methods (:mod:`hf_cascade.bench.batched`).
"""

from __future__ import annotations

import platform
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..drafters.corpus import CorpusNGrams
from ..placement import accelerators, synchronize, target_device_dtype
from .build import build_method
from .calls import encode, generation_kwargs, rotated, timed
from .config import DRAFT_FAMILY, BenchConfig
from .costs import build_costs
from .methods import Method, MethodUnavailable
from .summary import summarize
from .swi import record_times


@dataclass
class BenchResult:
    """Everything a benchmark measured.

    Attributes:
        config: the :class:`BenchConfig` as a dict.
        methods: methods that ran, in base rotation order (``plain`` first).
        records: one dict per (prompt, method): timing, token counts, equality with plain, stats.
        summary: per category and ``"overall"``, per method (see :func:`~hf_cascade.bench.summary.summarize`).
        errors: method -> why it could not run (build failure or an exception while generating).
        environment: versions, threads, model names.
        costs: per cost model of the standardized walltime improvement, the costs charged (target, drafters,
            per method; :func:`~hf_cascade.bench.costs.build_costs`).
        batched: the batched sweep (:func:`~hf_cascade.bench.batched.run_batched`); ``None`` without
            ``config.batch_sizes`` (and then not in :meth:`to_dict`).
    """

    config: dict
    methods: list[str]
    records: list[dict]
    summary: dict
    errors: dict[str, str] = field(default_factory=dict)
    environment: dict = field(default_factory=dict)
    costs: dict = field(default_factory=dict)
    batched: dict | None = None

    def to_dict(self) -> dict:
        out = {
            "config": self.config,
            "methods": self.methods,
            "errors": self.errors,
            "environment": self.environment,
            "costs": self.costs,
            "summary": self.summary,
            "records": self.records,
        }
        if self.batched is not None:
            out["batched"] = self.batched
        return out


def _build_methods(
    config: BenchConfig,
    model: Any,
    drafts: list,
    errors: dict,
    verifier: Any = None,
    assisted_draft: Any = None,
    tree: dict | None = None,
    strategy_drafts: Mapping[str, list] | None = None,
) -> dict[str, Method]:
    """Every method of ``config``, each with the draft models of its strategy (``strategy_drafts`` of its
    :data:`~hf_cascade.bench.config.DRAFT_FAMILY`, else the shared ``drafts``) and only the options set in
    ``config`` (see :meth:`~hf_cascade.bench.config.BenchConfig.cascade_kwargs`); a method that cannot be
    built is recorded in ``errors``."""
    corpus = CorpusNGrams.load(config.corpus) if config.corpus else None
    maxgram_corpus = corpus if "maxgram" in config.strategies else None
    own = dict(strategy_drafts or {})
    methods: dict[str, Method] = {}
    for name in config.methods:
        family = DRAFT_FAMILY.get(name)
        try:
            methods[name] = build_method(
                name,
                model,
                list(own.get(family) or drafts) if family else drafts,
                strategy_kwargs=config.cascade_kwargs(),
                maxgram_kwargs=config.cascade_kwargs(maxgram_alone=True),
                sampling=config.sampling,
                verifier=verifier,
                assisted_draft=assisted_draft,
                window=config.window,
                tree=tree if tree is not None else config.tree,
                corpus=corpus,
                maxgram_corpus=maxgram_corpus,
            )
        except MethodUnavailable as exc:
            errors[name] = str(exc)
    if "plain" not in methods:
        raise RuntimeError(f"plain generate could not be set up: {errors.get('plain')}")
    return methods


def _environment(
    model: Any, drafts: list, verifier: Any = None, strategy_drafts: Mapping[str, list] | None = None
) -> dict:
    import transformers

    def describe(m):
        return {
            "class": type(m).__name__,
            "name_or_path": getattr(m.config, "_name_or_path", "") or "",
            "parameters": int(sum(p.numel() for p in m.parameters())),
        }

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "device": device_description(model),
        "target": describe(model),
        "drafts": [describe(d) for d in drafts],
        **(
            {"strategy_drafts": {k: [describe(d) for d in v] for k, v in strategy_drafts.items()}}
            if strategy_drafts
            else {}
        ),
        **({"verifier": describe(verifier)} if verifier is not None else {}),
    }


def device_description(model: Any) -> dict:
    """Where the target ran: its input device, its accelerators' names (``name``: the CPU's architecture on a CPU),
    its dtype, and the attention implementation of its configuration."""
    device, dtype = target_device_dtype(model)
    names = []
    for d in accelerators(model) or (device,):
        if d.type == "cuda":
            names.append(torch.cuda.get_device_name(d))
        elif d.type == "cpu":
            names.append(f"CPU ({platform.machine()})")
        else:
            names.append(str(d))
    return {
        "device": str(device),
        "accelerators": [str(d) for d in accelerators(model)],
        "name": ", ".join(dict.fromkeys(names)),
        "dtype": str(dtype).removeprefix("torch."),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
    }


def _kernel_choices() -> dict:
    """What was timed once in this process (the CPU kernels' head block and screens' choices, the tree assistants'
    verification profiles): every method of the run shares them, and they differ between processes on one machine
    (``docs/benchmarks.md``)."""
    from ..backends.cpu.argmax_screen import screen_choices
    from ..backends.cpu.verify_head import calibrated_block_rows
    from ..measure import measured_profiles

    return {"head_blocks": calibrated_block_rows(), "screens": screen_choices(), "verify_profiles": measured_profiles()}


def run_benchmark(
    config: BenchConfig,
    model: Any,
    tokenizer: Any,
    prompts: Sequence[dict],
    drafts: Sequence[Any] = (),
    progress: bool = False,
    verifier: Any = None,
    assisted_draft: Any = None,
    strategy_drafts: Mapping[str, Sequence[Any]] | None = None,
) -> BenchResult:
    """Measure every method of ``config`` on ``prompts`` with the loaded ``model`` (and ``drafts``).

    Args:
        config: settings (the loading fields ``target``, ``drafts``, ``prompts_path`` are ignored here).
        model: the target, a transformers causal LM in eval mode.
        tokenizer: its tokenizer (to encode ``prompt`` texts and decode outputs).
        prompts: dicts with ``category`` and ``prompt`` (text) or ``input_ids``; other keys are kept.
        drafts: draft models, largest first, shared by every strategy without its own in ``strategy_drafts``
            (``cascade``, ``hsddw``, ``glide``, ``redrafter`` and their variants) and the ``hf-assisted`` baselines.
        progress: show a tqdm bar over prompts (on stderr).
        verifier: HSDDW's pre-verifier (a stronger draft model), if any.
        assisted_draft: the draft model of the ``hf-assisted*`` baselines (default: ``drafts[0]``).
        strategy_drafts: draft models per strategy (``{"cascade": [xs], "glide": [glide_head]}``), also used by
            the strategy's variants (``hsddw-single``, ``hsddw-every-step``, ``glide-chain``, ``redrafter-w1``,
            ``redrafter-flat``).
    """
    if not prompts:
        raise ValueError("run_benchmark needs at least one prompt")
    drafts = list(drafts)
    own = {k: list(v) for k, v in (strategy_drafts or {}).items()}
    errors: dict[str, str] = {}
    tree, environment = config.tree, _environment(model, drafts, verifier, own)
    if tree.get("verify_cost") == "measure" and "glide" in config.draft_families:  # this machine's tree cost profile
        from ..measure import measure_verify_cost

        tree["verify_cost"] = measure_verify_cost(model, max_nodes=config.max_tree_nodes or 24)
        environment["verify_cost_measured"] = list(tree["verify_cost"].relative)
    methods = _build_methods(config, model, drafts, errors, verifier, assisted_draft, tree, own)
    kwargs = generation_kwargs(config, tokenizer)
    device, devices = target_device_dtype(model)[0], accelerators(model)  # inputs' device; clocks wait for these

    # One untimed warm-up generate per method (first-call allocations, lazy imports, caches).
    first_ids, first_mask = encode(tokenizer, prompts[0], device)
    warm = generation_kwargs(config, tokenizer, max_new_tokens=config.warmup_tokens)
    for name in list(methods):
        try:
            timed(methods[name], first_ids, first_mask, warm, config.seed, devices)
        except Exception as exc:  # a baseline that breaks must not stop the others
            if name == "plain":
                raise
            errors[name] = f"{type(exc).__name__}: {exc}"
            del methods[name]
            continue
        methods[name].after_warmup()

    # The standardized walltime improvement's costs (measured ones time the models: before the timed runs).
    tables, costs = (
        ({}, {})
        if config.batch_sizes
        else build_costs(config.cost_models, model, {name: m.level_models() for name, m in methods.items()})
    )

    records: list[dict] = []
    # with batch sizes the run is the batched sweep (batch size 1 included when asked for), not the single-prompt runs
    # Each prompt ``config.draws`` times in a row, draw d seeded ``seed + prompt + d * len(prompts)`` (draw 0 as
    # with one draw); a record's ``prompt_index`` numbers these runs, so every summary pairs methods per run.
    runs = [] if config.batch_sizes else [(p, d) for p in range(len(prompts)) for d in range(config.draws)]
    iterator = enumerate(runs)
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, total=len(runs), desc="bench", unit="run")
    for i, (p, draw) in iterator:
        prompt, seed = prompts[p], config.seed + p + draw * len(prompts)
        ids, mask = encode(tokenizer, prompt, device)
        outputs: dict[str, torch.Tensor] = {}
        prompt_records: list[dict] = []
        for position, name in enumerate(rotated(list(methods), i)):
            try:
                out, stats, seconds = timed(methods[name], ids, mask, kwargs, seed, devices)
            except Exception as exc:
                if name == "plain":
                    raise
                errors[name] = f"{type(exc).__name__} on prompt {i}: {exc}"
                del methods[name]
                continue
            new = out[0, ids.shape[1] :]
            outputs[name] = new
            prompt_records.append(
                {
                    "prompt_index": i,
                    "draw": draw,
                    "question_id": prompt.get("question_id"),
                    "category": prompt.get("category", "all"),
                    "method": name,
                    "order": position,
                    "prompt_tokens": int(ids.shape[1]),
                    "new_tokens": int(new.numel()),
                    "seconds": seconds,
                    "tokens_per_second": new.numel() / seconds if seconds > 0 else 0.0,
                    "output_text": tokenizer.decode(new, skip_special_tokens=True),
                    "stats": stats,
                }
            )
            prompt_records[-1]["standardized_time"] = record_times(
                prompt_records[-1], {c: tables[c][name] for c in tables}, methods[name].one_forward_per_token
            )
        plain = outputs.get("plain")
        for rec in prompt_records:
            # Sampled outputs differ between methods by design (same distribution, other random draws).
            same = None if config.sampling or plain is None else torch.equal(outputs[rec["method"]], plain)
            rec["identical_to_plain"] = same
            rec["prompt"] = prompt.get("prompt")
        records.extend(prompt_records)

    batched = None
    if config.batch_sizes:  # the sweep: same methods, same prompts, in batches
        from .batched import run_batched

        batched = run_batched(config, model, tokenizer, prompts, methods, progress=progress)
    environment["cpu_kernels"] = _kernel_choices()
    ran = {r["method"] for r in records} | {r["method"] for r in (batched or {}).get("records", [])}
    names = [n for n in config.methods if n in ran]
    return BenchResult(
        config=config.to_dict(),
        methods=names,
        records=records,
        summary=summarize(records, names, strategies=[n for n in config.strategies if n in names]),
        errors=errors,
        environment=environment,
        costs=costs,
        batched=batched,
    )


def compare_assistants(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[dict],
    assistants: dict[str, Any],
    max_new_tokens: int = 128,
    warmup_tokens: int = 32,
) -> tuple[list[dict], int]:
    """Greedy A/B of several assistants on ``prompts``, interleaved as in :func:`run_benchmark` (one
    untimed warm-up each, then every prompt through every assistant in rotating order), for settings a
    ``BenchConfig`` does not describe. Returns records (``prompt_index``, ``category``, ``method``,
    ``seconds``, ``tokens_per_call``) for :func:`~hf_cascade.bench.summary.paired`, and on how many
    prompts every assistant gave the same output."""
    device, devices = target_device_dtype(model)[0], accelerators(model)
    warm = encode(tokenizer, {"prompt": "Question: Hello\n\nAnswer:"}, device)
    for assistant in assistants.values():
        model.generate(
            input_ids=warm[0],
            attention_mask=warm[1],
            assistant_model=assistant,
            do_sample=False,
            max_new_tokens=warmup_tokens,
        )
    records, identical = [], 0
    for i, prompt in enumerate(prompts):
        ids, mask = encode(tokenizer, prompt, device)
        outputs = set()
        for name in rotated(list(assistants), i):
            for d in devices:
                synchronize(d)
            t0 = time.perf_counter()
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                assistant_model=assistants[name],
                do_sample=False,
                max_new_tokens=max_new_tokens,
            )
            for d in devices:
                synchronize(d)
            seconds = time.perf_counter() - t0
            calls = max(1, assistants[name].last_stats.target_calls)
            records.append(
                {
                    "prompt_index": i,
                    "category": prompt.get("category", "all"),
                    "method": name,
                    "seconds": seconds,
                    "tokens_per_call": (out.shape[1] - ids.shape[1]) / calls,
                }
            )
            outputs.add(tuple(out[0].tolist()))
        identical += len(outputs) == 1
    return records, identical
