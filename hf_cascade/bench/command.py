"""``hf-cascade bench``: its arguments (:func:`add_bench_arguments`), the :class:`~hf_cascade.bench.BenchConfig`
they give (:func:`bench_config`) and the run (:func:`run`: load, measure, write, print).

Rules of ``--strategy`` and ``--draft``: ``--strategy`` is one strategy, a comma list or ``all``, every
one measured in the same interleaved rotation; ``--draft NAME=PATH`` gives strategy ``NAME`` its own draft
model(s), a bare ``--draft PATH`` is shared by every strategy without its own (the single-strategy form),
and on the default target a strategy with neither takes its shipped head
(:func:`~hf_cascade.bench.loading.draft_specs`). Assistant options not given on the command line are not
passed: each assistant runs with its library defaults.

``--batch-size 1,2,4,8`` adds the batched sweep after the single-prompt runs (:mod:`~hf_cascade.bench.batched`):
the same prompts in left-padded batches, the same methods but those that cannot batch (skipped for sizes
above 1, said before the run); a row that differs from plain's is said after it.

The device (``--device``, ``--dtype``, ``--device-map``, ``--attn-implementation``): the target loads there (by
default the first accelerator, else the CPU; float32 on a CPU, bfloat16 on an accelerator), causal-LM drafts with
it (heads follow the target at each call), every prompt is put on the target's input device and every timed call
synchronises the target's accelerators before each clock read. Without ``--baselines``: plain on a CPU, plain and
plain-compiled on an accelerator (:func:`~hf_cascade.bench.config.default_baselines`).

``--compare A B`` compares runs made apart (e.g. two commits) prompt by prompt through a reference both timed
(plain ``generate``; :mod:`~hf_cascade.bench.across`).

``--sync-phases`` makes the assistants' phase timings wait for the accelerator at each phase's edges (what
``Policy(sync_phases=True)`` asks of one assistant): each phase charged its own device work, at the price of the
synchronisations; by default no phase timer synchronises.

``--workload agent`` runs :mod:`~hf_cascade.bench.agent` instead (Max-Gram with vs without the answer memory on
separate calls that repeat earlier answers' material, paired; ``--per-category``, ``--max-new-tokens``,
``--agent-steps``, ``--memory``).

``--overhead`` runs :mod:`~hf_cascade.bench.overhead` instead (host milliseconds and device reads per target call on
the tiny target, every strategy, ``--prompts N --new-tokens N``; ``--compiled-strategies`` adds every strategy compiled
with a static cache, against compiled plain generate); the other arguments do not apply to it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from .config import (
    DRAFT_KIND,
    DTYPES,
    BenchConfig,
    default_baselines,
    default_device,
    default_dtype,
    parse_baselines,
    parse_batch_sizes,
    parse_cost_models,
    parse_drafts,
    parse_k_matrix,
    parse_strategies,
)


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``hf-cascade bench`` (every assistant option defaults to ``None``: not set)."""
    p.add_argument(
        "--target",
        default=None,
        help="target model: default (embedded Gemma-3-270M), smollm2, a local HF directory, a Hub repo id, or "
        "gguf:PATH",
    )
    p.add_argument(
        "--strategy",
        default=None,
        metavar="NAMES",
        type=_strategies,
        help="a comma list of maxgram,cascade,hsddw,glide,redrafter,recycling or all, measured in one interleaved run, "
        "each with its library defaults unless options below are given: maxgram = CascadeAssistant([MaxGram()]); "
        "cascade = CascadeAssistant([*drafts, MaxGram()]); hsddw = DynamicWindowAssistant(first draft, --verifier); "
        "glide = GlideAssistant(head); redrafter = ReDrafterAssistant(head); recycling = RecyclingAssistant() "
        "(default maxgram; with --overhead: every strategy)",
    )
    p.add_argument(
        "--draft",
        action="extend",
        nargs="+",
        default=[],
        metavar="[NAME=]PATH",
        help="draft model(s), largest first (HF directory, Hub repo id, gguf:PATH, smollm2, self:N = the "
        "target's first N "
        "layers). NAME=PATH gives strategy NAME its own (cascade=, hsddw=, glide=, redrafter=; repeat for several); "
        "a PATH without NAME is shared by the strategies without their own and the hf-assisted baselines. "
        "On the default target a strategy without one takes its shipped head (model_cards/: cascade and hsddw "
        "drafter-xs, glide glide-xs, redrafter redrafter-xs)",
    )
    p.add_argument(
        "--assisted-draft",
        default=None,
        metavar="PATH",
        help="draft model of the hf-assisted baselines (default: the first shared --draft)",
    )
    p.add_argument(
        "--verifier",
        default=None,
        metavar="PATH",
        help="--strategy hsddw: a stronger draft model that pre-verifies the --draft model (same specs as --draft)",
    )
    p.add_argument(
        "--window",
        type=int,
        default=None,
        metavar="K",
        help="HSDDW's max_window (default: its own) and the draft window of the hf-assisted-constant/-confidence "
        "baselines (default 10)",
    )
    p.add_argument(
        "--draft-length",
        type=int,
        default=None,
        help="glide: main-path draft tokens per step (default: GlideAssistant's)",
    )
    p.add_argument(
        "--max-tree-nodes", type=int, default=None, help="glide: cap on CAPE tree nodes (default: GlideAssistant's)"
    )
    p.add_argument(
        "--min-expansion-prob",
        type=float,
        default=None,
        help="glide: CAPE leaves out expansion tokens the draft gives probability < this (default: GlideAssistant's)",
    )
    p.add_argument(
        "--verify-cost",
        nargs="?",
        const="reference",
        default=None,
        choices=["reference", "measure"],
        help="glide: verify only the drafted nodes that pay for their cost; 'reference' (the default when "
        "given alone): VerifyCost.reference(), the reference CPU's profile; 'measure': measure_verify_cost() on "
        "this machine first (up to --max-tree-nodes nodes, about a minute)",
    )
    p.add_argument("--beam-width", type=int, default=None, help="redrafter: beams (default: ReDrafterAssistant's)")
    p.add_argument(
        "--beam-length", type=int, default=None, help="redrafter: draft tokens per beam (default: ReDrafterAssistant's)"
    )
    p.add_argument(
        "--k-matrix",
        default=None,
        metavar="JSON",
        help="K-matrix of the cascade as JSON (e.g. '[[2,10],[0,10]]') or a JSON file. The cascade options "
        "(--k-matrix to --maxgram-first) go to the cascade, and to Max-Gram alone only in a run without the cascade",
    )
    p.add_argument(
        "--lenience", type=float, default=None, help="lenience between drafters (>= 1; default: CascadeAssistant's)"
    )
    p.add_argument(
        "--maxgram-lenience",
        type=float,
        default=None,
        help="cascade: lenience of neural drafters' reviews of Max-Gram tokens (>= 1; 'inf' = no veto; default: "
        "CascadeAssistant's)",
    )
    p.add_argument(
        "--min-confidence",
        type=float,
        default=None,
        help="cascade: a neural drafter stops after a token it gave probability < this; redrafter: beam "
        "tokens below it are not verified; glide: the main path stops at a token below it "
        "(default: each assistant's own)",
    )
    p.add_argument(
        "--drop-unsure",
        action="store_true",
        help="cascade: with --min-confidence, drop the unsure token instead of drafting it (keep_unsure=False)",
    )
    p.add_argument(
        "--cost-aware",
        action="store_true",
        help="cascade: the smallest drafter's tokens go to the target only while they raise expected tokens "
        "per unit of measured verification time (cost_aware=True)",
    )
    p.add_argument(
        "--maxgram-first",
        action="store_true",
        help="cascade: Max-Gram's match goes to the target unreviewed, the smallest neural drafter continues it",
    )
    p.add_argument(
        "--corpus",
        default=None,
        metavar="FILE",
        help="maxgram / cascade: corpus n-grams (hf-cascade corpus) continuing Max-Gram's weak matches; "
        "also what the maxgram-corpus baseline uses",
    )
    p.add_argument(
        "--baselines",
        default=None,
        help="default: plain on a CPU, plain,plain-compiled on an accelerator; a comma list from "
        "plain,plain-kernels,pld,pld-tuned,hf-assisted,hf-assisted-constant,hf-assisted-confidence,"
        "economize,maxgram,maxgram-corpus,hsddw-single,hsddw-every-step,glide-chain,redrafter-w1,redrafter-flat,"
        "suffix,suffix-tree "
        "(plain is always included). suffix: SuffixDecoding with vLLM's defaults (up to 32 tokens, tree depth 24, "
        "max_spec_factor 1.0, min_token_prob 0.1, global cache of earlier responses) on ArcticInference's suffix "
        "trees (pip install arctic-inference), verified in our core; suffix-tree: the same with its speculation "
        "trees (use_tree_spec)",
    )
    p.add_argument(
        "--prompts",
        default=None,
        metavar="FILE",
        help="Spec-Bench question.jsonl (default: the bundled one); with --overhead: how many prompts of the "
        "tiny target (default 4)",
    )
    p.add_argument(
        "--per-category", type=int, default=3, metavar="N", help="prompts per Spec-Bench category (default 3)"
    )
    p.add_argument(
        "--prompt-format",
        choices=("plain", "chat"),
        default="plain",
        help="plain: the completion template (default); chat: each question as a user turn through the "
        "target tokenizer's chat template, as pipeline() prompts an instruct model",
    )
    p.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt (default 128)")
    p.add_argument(
        "--workload",
        choices=("prompts", "agent"),
        default="prompts",
        help="agent: Max-Gram with vs without the answer memory on separate calls that repeat earlier "
        "answers' material (hf_cascade.bench.agent); default: the Spec-Bench prompts",
    )
    p.add_argument("--agent-steps", type=int, default=3, metavar="N", help="--workload agent: calls per question")
    p.add_argument(
        "--memory",
        type=int,
        default=100_000,
        metavar="TOKENS",
        help="--workload agent: the memory's size limit (Policy(memory=...))",
    )
    p.add_argument("--sampling", action="store_true", help="do_sample=True with --temperature (default: greedy)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default 0.7)")
    p.add_argument("--seed", type=int, default=0, help="random seed (reset per prompt and method)")
    p.add_argument(
        "--draws",
        type=int,
        default=1,
        metavar="N",
        help="runs of each prompt, each with its own seed (with --sampling: N draws of every prompt's "
        "output, whose lengths differ between methods by chance; categories pool them; default 1)",
    )
    p.add_argument(
        "--cost-model",
        default="both",
        choices=["params", "measured", "both", "none"],
        help="standardized walltime improvement (SWI) reported beside wall time, per method: 'params' (each "
        "forward costs its model's parameter count, a verification of any number of rows one target "
        "forward), 'measured' (this machine's per-row costs, measured before the timed runs), 'both' "
        "(default) or 'none'",
    )
    p.add_argument(
        "--batch-size",
        default=None,
        metavar="SIZES",
        type=_batch_sizes,
        help="also measure batched generation: a comma list of batch sizes (e.g. 1,2,4,8); the prompts in "
        "consecutive left-padded batches, every method interleaved per batch, throughput and speedup vs "
        "plain and plain-kernels per size (baselines that cannot batch are skipped above 1; default: none)",
    )
    p.add_argument(
        "--sync-phases",
        action="store_true",
        help="the assistants' phase timings (draft, verify, accept, ... in the results) wait for the "
        "accelerator at each phase's edges, so each phase is charged its own device work (about 8 "
        "synchronisations per step); default: none (Policy(sync_phases=...)). No effect on a CPU",
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="output directory (default bench_results; with --overhead bench_overhead, with --compare bench_compare)",
    )
    d = p.add_argument_group(
        "device",
        "where the target runs; the defaults follow the machine (on a GPU: hf-cascade "
        "bench --strategy all --device cuda)",
    )
    d.add_argument(
        "--device",
        default=None,
        metavar="DEVICE",
        type=_device,
        help="torch device of the target and the prompts: cpu, cuda, cuda:1, mps, ... (default: the first "
        "available accelerator, else cpu)",
    )
    d.add_argument(
        "--dtype",
        default=None,
        choices=DTYPES,
        help="the target's dtype (default: float32 on a CPU, bfloat16 on an accelerator)",
    )
    d.add_argument(
        "--device-map",
        default=None,
        metavar="MAP",
        type=_device_map,
        help="from_pretrained's device_map for the target: auto, balanced, sequential or a JSON object of "
        "module -> device (default: the whole target on --device)",
    )
    d.add_argument(
        "--attn-implementation",
        default=None,
        metavar="NAME",
        help="the target's attention: eager, sdpa, flash_attention_2, ... (default: transformers')",
    )
    o = p.add_argument_group(
        "overhead measurement",
        "host time and device reads per target call on a tiny target where the forward "
        "is nearly free (the GPU regime; hf_cascade.bench.overhead): every strategy with its defaults, "
        "plain generate, transformers' prompt lookup and plain generate compiled with a static cache",
    )
    o.add_argument(
        "--overhead",
        action="store_true",
        help="run the overhead measurement instead of the Spec-Bench comparison (uses --out, --prompts N, "
        "--new-tokens, --repeats, --threads (default 1), --no-progress; --strategy NAMES and --baselines "
        "pld,glide-chain measure those and plain only)",
    )
    o.add_argument(
        "--new-tokens", type=int, default=128, metavar="N", help="--overhead: new tokens per prompt (default 128)"
    )
    o.add_argument(
        "--repeats",
        type=int,
        default=3,
        metavar="N",
        help="--overhead: timed rounds over the prompts; per prompt the fastest counts (default 3)",
    )
    o.add_argument(
        "--no-compile",
        action="store_true",
        help="--overhead: leave out compiled plain generate (its compile takes tens of seconds on a CPU)",
    )
    o.add_argument(
        "--compile-backend",
        default="inductor",
        metavar="NAME",
        help="--overhead: CompileConfig(backend=...) of compiled plain generate (default inductor)",
    )
    o.add_argument(
        "--compiled-strategies",
        action="store_true",
        help="--overhead: also measure every strategy compiled (a row '<strategy>, compiled': the same "
        'assistant with cache_implementation="static", compiled plain\'s CompileConfig and max_cache_len; '
        "verification through the core's compiled decoder), compared with compiled plain generate: host "
        "time per target call over its host time per token, speedup of wall time per token (the eager "
        "rows stay compared with plain). Adds the strategies' compile; not with --no-compile",
    )
    c = p.add_argument_group(
        "comparing runs made apart",
        "two commits cannot share one process, so not one rotation: "
        "each run's strategies against a reference both runs timed (hf_cascade.bench.across)",
    )
    c.add_argument(
        "--compare",
        nargs="+",
        default=None,
        metavar="RUN",
        help="compare earlier runs instead of measuring: pairs A B [A2 B2 ...] of results.json files or their "
        "folders; each strategy's speed over --reference in B over that in A, per prompt, pooled over the "
        "pairs, with 95%% bootstrap intervals (compare.md and compare.json in --out)",
    )
    c.add_argument(
        "--reference",
        default="plain",
        metavar="METHOD",
        help="--compare: the method both runs timed that every speed is taken against (default plain: "
        "transformers' loop, the same code in both runs)",
    )


def _strategies(text: str) -> str:
    """``--strategy``'s value checked (argparse reports an unknown name with the usage), comma-joined."""
    try:
        return ",".join(parse_strategies(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _device(text: str) -> str:
    """``--device``'s value, a torch device name (argparse reports a bad one with the usage)."""
    import torch

    try:
        return str(torch.device(text))
    except RuntimeError as exc:
        raise argparse.ArgumentTypeError(f"not a torch device: {text!r}") from exc


def _device_map(text: str) -> str | dict:
    """``--device-map``'s value: a name (``auto``, ...) or a JSON object (argparse reports bad JSON with the usage)."""
    import json

    if not text.lstrip().startswith("{"):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--device-map: not a JSON object: {exc}") from exc


def _batch_sizes(text: str) -> list[int]:
    """``--batch-size``'s value checked (argparse reports a bad one with the usage)."""
    try:
        return parse_batch_sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def bench_config(args: argparse.Namespace) -> BenchConfig:
    """The :class:`~hf_cascade.bench.BenchConfig` of parsed ``bench`` arguments; the device's defaults resolved
    (:func:`~hf_cascade.bench.config.default_device`, ``default_dtype``, ``default_baselines``)."""
    shared, per_strategy = parse_drafts(args.draft)
    device = getattr(args, "device", None) or default_device()
    baselines = args.baselines if args.baselines is not None else default_baselines(device)
    return BenchConfig(
        strategy=args.strategy or "maxgram",
        baselines=parse_baselines(baselines),
        k_matrix=parse_k_matrix(args.k_matrix),
        lenience=args.lenience,
        maxgram_lenience=args.maxgram_lenience,
        min_confidence=args.min_confidence,
        maxgram_first=args.maxgram_first or None,
        keep_unsure=False if args.drop_unsure else None,
        cost_aware=args.cost_aware or None,
        window=args.window,
        draft_length=args.draft_length,
        max_tree_nodes=args.max_tree_nodes,
        min_expansion_prob=args.min_expansion_prob,
        verify_cost=args.verify_cost or False,
        beam_width=args.beam_width,
        beam_length=args.beam_length,
        max_new_tokens=args.max_new_tokens,
        sampling=args.sampling,
        temperature=args.temperature,
        seed=args.seed,
        draws=args.draws,
        target=args.target,
        drafts=shared,
        strategy_drafts=per_strategy,
        verifier=args.verifier,
        assisted_draft=args.assisted_draft,
        prompts_path=args.prompts,
        per_category=args.per_category,
        prompt_format=args.prompt_format,
        corpus=args.corpus,
        cost_models=parse_cost_models(args.cost_model),
        batch_sizes=getattr(args, "batch_size", None) or [],
        device=device,
        dtype=getattr(args, "dtype", None) or default_dtype(device),
        device_map=getattr(args, "device_map", None),
        attn_implementation=getattr(args, "attn_implementation", None),
    )


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> int:
    """Run ``hf-cascade bench``: resolve each strategy's drafts, load target, drafts and prompts, measure,
    write ``--out`` and print the report; ``SystemExit`` when a strategy has no draft model. With ``--overhead``:
    :func:`hf_cascade.bench.overhead.run` instead."""
    import dataclasses

    if getattr(args, "sync_phases", False):  # every phase timer the run builds synchronises (core.stats.PhaseTimer)
        from ..core.stats import synchronized_phases

        with synchronized_phases():
            return run(argparse.Namespace(**{**vars(args), "sync_phases": False}), log)
    if getattr(args, "overhead", False):
        from .overhead import run as run_overhead

        return run_overhead(args, log=log)
    if getattr(args, "workload", "prompts") == "agent":
        from .agent import run as run_agent

        return run_agent(args, log=log)
    if getattr(args, "compare", None):
        from .across import run as run_compare

        return run_compare(args.compare, args.out or "bench_compare", args.reference, log=log)

    from .loading import draft_specs, load_draft_sets, load_model, load_prompts, target_placement
    from .report import markdown_report, write_results
    from .runner import run_benchmark

    config = bench_config(args)
    specs = draft_specs(config)  # each strategy's own, else the shared --draft, else the shipped head
    missing = [s for s in config.strategies if s in DRAFT_KIND and s not in specs]
    if missing:
        raise SystemExit(
            f"hf-cascade bench: --strategy {', '.join(missing)} needs its draft model(s): "
            + " ".join(f"--draft {s}=PATH" for s in missing)
            + " (shipped heads are used only on the default target, Gemma-3-270M)"
        )
    for family, paths in specs.items():
        if family not in config.strategy_drafts and not config.drafts:
            log(f"{family}: shipped {', '.join(paths)}")
    config = dataclasses.replace(config, strategy_drafts=specs)  # results.json records what each strategy used
    log(f"loading target {config.target or 'default (Gemma-3-270M)'}")
    log(
        f"on {config.device} in {config.dtype}"
        + (f", device_map {config.device_map}" if config.device_map else "")
        + (f", attention {config.attn_implementation}" if config.attn_implementation else "")
    )
    placement = target_placement(config)
    model, tokenizer = load_model(config.target, **placement)
    drafts, own = load_draft_sets(config.drafts, specs, target=model)
    verifier = load_draft_sets([config.verifier], {}, target=model)[0][0] if config.verifier else None
    assisted = load_draft_sets([config.assisted_draft], {}, target=model)[0][0] if config.assisted_draft else None
    prompts = load_prompts(config.prompts_path, config.per_category, tokenizer, config.prompt_format)
    log(
        f"{len(prompts)} prompts{f' x {config.draws} draws' if config.draws > 1 else ''} x methods "
        f"{', '.join(config.methods)}, {config.max_new_tokens} new tokens"
    )
    if config.batch_sizes:
        from .batched import skipped

        log(f"then batch sizes {', '.join(map(str, config.batch_sizes))}")
        for name, why in skipped(config.methods, max(config.batch_sizes)).items():
            log(f"note: {name} is skipped for batch sizes above 1 ({why})")
    result = run_benchmark(
        config,
        model,
        tokenizer,
        prompts,
        drafts=drafts,
        progress=not args.no_progress,
        verifier=verifier,
        assisted_draft=assisted,
        strategy_drafts=own,
    )
    paths = write_results(result, args.out or "bench_results")
    for x in (result.batched or {}).get("mismatches", []):
        log(
            f"MISMATCH: {x['method']} at batch size {x['batch_size']}: prompt(s) "
            f"{', '.join(map(str, x['prompt_indices']))} differ from plain generate"
        )
    print(markdown_report(result))
    print()
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}")
    return 0
