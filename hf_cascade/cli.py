"""``hf-cascade``: command line entry point (``bench`` and ``demo``).

    hf-cascade bench --per-category 1 --max-new-tokens 64 --baselines pld,economize --out bench_out
    hf-cascade demo

Only this module and :mod:`hf_cascade.demo` print; the library returns data.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence


def _add_run_options(p) -> None:
    """``--threads`` and ``--no-progress``, shared by every command that runs a model."""
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _set_threads(args: argparse.Namespace) -> None:
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)


def _add_bench(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="compare plain generate, baselines and an hf_cascade strategy on Spec-Bench prompts",
        description="Methods are interleaved prompt by prompt (rotating order) after one warm-up generate each; "
        "speedups are against plain generate in the same run.",
    )
    p.add_argument("--target", default=None,
                   help="target model: default (embedded Gemma-3-270M), smollm2, a local HF directory, a Hub repo id, or gguf:PATH")
    p.add_argument("--strategy", choices=["maxgram", "cascade", "hsddw", "glide", "redrafter"], default="maxgram",
                   help="maxgram = CascadeAssistant([MaxGram()]); cascade = CascadeAssistant([*drafts, MaxGram()]); "
                        "hsddw = DynamicWindowAssistant(first draft, --verifier); glide = GlideAssistant(--draft, cape=True); "
                        "redrafter = ReDrafterAssistant(--draft)")
    p.add_argument("--draft", action="extend", nargs="+", default=[], metavar="PATH",
                   help="draft model(s), largest first (HF directory, Hub repo id, gguf:PATH, smollm2, self:N = the target's first N layers); "
                        "needed by --strategy cascade / hsddw and the hf-assisted baselines")
    p.add_argument("--assisted-draft", default=None, metavar="PATH",
                   help="draft model of the hf-assisted baselines (default: the first --draft)")
    p.add_argument("--verifier", default=None, metavar="PATH",
                   help="--strategy hsddw: a stronger draft model that pre-verifies the --draft model (same specs as --draft)")
    p.add_argument("--window", type=int, default=10, metavar="K",
                   help="draft window of the hf-assisted-constant/-confidence baselines and HSDDW's max_window (default 10)")
    p.add_argument("--draft-length", type=int, default=5, help="glide: main-path draft tokens per step (default 5)")
    p.add_argument("--max-tree-nodes", type=int, default=None, help="glide: cap on CAPE tree nodes (default none)")
    p.add_argument("--min-expansion-prob", type=float, default=0.0,
                   help="glide: CAPE leaves out expansion tokens the draft gives probability < this (default 0)")
    p.add_argument("--verify-cost", nargs="?", const="reference", default=None, choices=["reference", "measure"],
                   help="glide: verify only the drafted nodes that pay for their cost; 'reference' (the default when "
                        "given alone): VerifyCost.reference(), the reference CPU's profile; 'measure': measure_verify_cost() on "
                        "this machine first (up to --max-tree-nodes nodes, about a minute)")
    p.add_argument("--beam-width", type=int, default=4, help="redrafter: beams (default 4)")
    p.add_argument("--beam-length", type=int, default=5, help="redrafter: draft tokens per beam (default 5)")
    p.add_argument("--k-matrix", default=None, metavar="JSON",
                   help="K-matrix of the cascade as JSON (e.g. '[[2,10],[0,10]]') or a JSON file")
    p.add_argument("--lenience", type=float, default=1.0, help="lenience between drafters (>= 1; default 1)")
    p.add_argument("--maxgram-lenience", type=float, default=1.0,
                   help="cascade: lenience of neural drafters' reviews of Max-Gram tokens (>= 1; 'inf' = no veto; default 1)")
    p.add_argument("--min-confidence", type=float, default=0.0,
                   help="cascade: a neural drafter stops after a token it gave probability < this; redrafter: beam "
                        "tokens below it are not verified; glide: the main path stops at a token below it "
                        "(default 0 = never)")
    p.add_argument("--drop-unsure", action="store_true",
                   help="cascade: with --min-confidence, drop the unsure token instead of drafting it (keep_unsure=False)")
    p.add_argument("--cost-aware", action="store_true",
                   help="cascade: the smallest drafter's tokens go to the target only while they raise expected tokens "
                        "per unit of measured verification time (cost_aware=True)")
    p.add_argument("--maxgram-first", action="store_true",
                   help="cascade: Max-Gram's match goes to the target unreviewed, the smallest neural drafter continues it")
    p.add_argument("--corpus", default=None, metavar="FILE",
                   help="maxgram / cascade: corpus n-grams (hf-cascade corpus) continuing Max-Gram's weak matches; "
                        "also what the maxgram-corpus baseline uses")
    p.add_argument("--baselines", default="plain",
                   help="comma list from plain,plain-kernels,pld,pld-tuned,hf-assisted,hf-assisted-constant,hf-assisted-confidence,"
                        "economize,maxgram,maxgram-corpus,hsddw-single,glide-chain,redrafter-w1,redrafter-flat,suffix,suffix-tree "
                        "(plain is always included). suffix: SuffixDecoding with vLLM's defaults (up to 32 tokens, tree depth 24, "
                        "max_spec_factor 1.0, min_token_prob 0.1, global cache of earlier responses) on ArcticInference's suffix "
                        "trees (pip install arctic-inference), verified in our core; suffix-tree: the same with its speculation "
                        "trees (use_tree_spec)")
    p.add_argument("--prompts", default=None, metavar="FILE", help="Spec-Bench question.jsonl (default: the bundled one)")
    p.add_argument("--per-category", type=int, default=3, metavar="N", help="prompts per Spec-Bench category (default 3)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt (default 128)")
    p.add_argument("--sampling", action="store_true", help="do_sample=True with --temperature (default: greedy)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default 0.7)")
    p.add_argument("--seed", type=int, default=0, help="random seed (reset per prompt and method)")
    p.add_argument("--out", default="bench_results", metavar="DIR", help="output directory (default bench_results)")
    _add_run_options(p)


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="stream answers of the default model with CascadeAssistant([MaxGram()]) and time it")
    p.add_argument("--max-new-tokens", type=int, default=96, help="new tokens per prompt (default 96)")


def _add_distill(sub) -> None:
    p = sub.add_parser(
        "distill",
        help="store the target's greedy responses to training prompts (resumable; never Spec-Bench)",
        description="Runs the frozen target over training prompts (default: GSM8K train, Alpaca seed tasks, "
        "Vicuna bench from shared/data/train_prompts) and appends prompt + response to a memory-mapped store. "
        "Interrupt at any time; the same command resumes.",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="distillation directory (created or resumed)")
    p.add_argument("--target", default=None, help="target model (as for bench; default Gemma-3-270M)")
    p.add_argument("--prompts", action="extend", nargs="+", default=None, metavar="FILE",
                   help="JSONL prompt files (fields turns / instruction / question / prompt / text)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="response length cap (default 128)")
    p.add_argument("--batch-size", type=int, default=16, help="prompts per batched generate (default 16)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="stop once N prompts are stored")
    p.add_argument("--hidden-states", action="store_true", help="also store the target's last hidden states")
    _add_run_options(p)


def run_distill(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .bench.loading import load_model
    from .training import DistillConfig, distill, training_prompts

    _set_threads(args)
    prompts = training_prompts(args.prompts)
    _log(f"{len(prompts)} training prompts (Spec-Bench questions excluded); loading target {args.target or 'default'}")
    model, tokenizer = load_model(args.target)
    cfg = DistillConfig(Path(args.out), max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                        hidden_states=args.hidden_states, limit=args.limit)
    store = distill(model, tokenizer, cfg, prompts, target_name=args.target or "default",
                    progress=not args.no_progress)
    print(f"{len(store)} sequences, {store.num_tokens} tokens in {args.out}")
    return 0


def _add_questions(sub) -> None:
    p = sub.add_parser(
        "questions",
        help="sample new training questions from the target (more varied distillation prompts)",
        description="The target samples new questions after two seed questions from the shared training prompts "
        "(Alpaca seed tasks and Vicuna bench; GSM8K in a few); appends them to a JSONL file for "
        "`hf-cascade distill --prompts FILE`. Running it again adds --n more.",
    )
    p.add_argument("--out", required=True, metavar="FILE", help="JSONL file of {\"question\": ...} lines (appended)")
    p.add_argument("--n", type=int, default=600, help="questions to add (default 600)")
    p.add_argument("--target", default=None, help="target model (as for bench; default Gemma-3-270M)")
    p.add_argument("--batch-size", type=int, default=32, help="seed prompts per sampled batch (default 32)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    _add_run_options(p)


def run_questions(args: argparse.Namespace) -> int:
    from .bench.loading import load_model
    from .data import load_train_prompts
    from .training.questions import QuestionConfig, append_questions, read_questions, sample_questions

    _set_threads(args)
    general = load_train_prompts(files=["alpaca_seed_tasks.jsonl", "vicuna_bench_question.jsonl"])
    gsm8k = load_train_prompts(files=["gsm8k_train.jsonl"])
    have = read_questions(args.out)
    model, tokenizer = load_model(args.target)
    cfg = QuestionConfig(n=args.n, batch_size=args.batch_size, seed=args.seed + len(have))
    new = sample_questions(model, tokenizer, general, gsm8k, cfg, exclude=have, progress=not args.no_progress)
    append_questions(args.out, new)
    print(f"{len(have) + len(new)} questions in {args.out}")
    return 0


def _add_corpus(sub) -> None:
    p = sub.add_parser(
        "corpus",
        help="count corpus n-grams over a distillation store, for MaxGram(corpus=...) / bench --corpus",
        description="For every context of 1..--max-n tokens seen at least --min-count times before a response token "
        "of the store (the target's own outputs), keeps the most frequent next token and its counts (safetensors).",
    )
    p.add_argument("--data", required=True, metavar="DIR", help="distillation directory (hf-cascade distill)")
    p.add_argument("--out", required=True, metavar="FILE", help="output file (.safetensors)")
    p.add_argument("--max-n", type=int, default=4, help="longest context (default 4)")
    p.add_argument("--min-count", type=int, default=2, help="drop contexts seen fewer times (default 2)")


def run_corpus(args: argparse.Namespace) -> int:
    from .drafters.corpus import CorpusNGrams

    corpus = CorpusNGrams.from_store(args.data, max_n=args.max_n, min_count=args.min_count)
    corpus.save(args.out, data=str(args.data), min_count=str(args.min_count))
    print(f"{len(corpus)} contexts (max_n={corpus.max_n}) in {args.out}")
    return 0


def _add_train(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train a drafter head on distillation data (target frozen); saves Hub layout with a model card",
        description="vanilla: a small independent causal-LM drafter (for CascadeAssistant / DynamicWindowAssistant); "
        "glide: a GLIDE draft reading the target's KV cache (GlideAssistant); redrafter: a recurrent draft head on the "
        "target's last hidden state (ReDrafterAssistant). Evaluates held-out greedy acceptance every --eval-every steps "
        "and keeps the best checkpoint.",
    )
    p.add_argument("head", choices=["vanilla", "glide", "redrafter"])
    p.add_argument("--data", required=True, metavar="DIR", help="directory written by `hf-cascade distill`")
    p.add_argument("--out", required=True, metavar="DIR", help="checkpoint directory (Hub layout)")
    p.add_argument("--target", default=None, help="target model (as for bench; default Gemma-3-270M)")
    p.add_argument("--preset", default=None,
                   help="size preset: vanilla xs, s, m (default s); glide xs, s (default xs); redrafter xs, s (default s)")
    p.add_argument("--no-cross-attention", action="store_true",
                   help="glide: train the paper's controlled baseline, the same draft without cross-attention")
    p.add_argument("--target-layers", type=int, nargs="+", default=None, metavar="L",
                   help="glide: the target layer each draft layer reads (default: the paper's l = N_T - N_D + m)")
    p.add_argument("--draft-vocab", type=int, default=None, metavar="N", help="reduced vocabulary size (default: preset's)")
    p.add_argument("--soft-labels", type=int, default=0, metavar="K",
                   help="vanilla: also distil the target's top-K next-token distribution at every position (one "
                   "teacher-forced pass over --data, cached there; 0 = greedy tokens only)")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-records", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    _add_run_options(p)


def _trainers() -> dict:
    """``head -> (presets, default preset, train function)`` of ``hf-cascade train``."""
    from .training.run import PRESETS, train_vanilla
    from .training.run_glide import GLIDE_PRESETS, train_glide
    from .training.run_redrafter import DEFAULT_PRESET, PRESETS as REDRAFTER_PRESETS, train_redrafter

    return {"vanilla": (PRESETS, "s", train_vanilla), "glide": (GLIDE_PRESETS, "xs", train_glide),
            "redrafter": (REDRAFTER_PRESETS, DEFAULT_PRESET, train_redrafter)}


def run_train(args: argparse.Namespace) -> int:
    import dataclasses
    from pathlib import Path

    from .bench.loading import load_model
    from .training.loop import TrainConfig
    from .training.store import DistillStore

    presets, default, train_fn = _trainers()[args.head]
    preset = args.preset or default
    if preset not in presets:
        raise ValueError(f"unknown {args.head} preset {preset!r}; choose from {', '.join(presets)}")
    if args.no_cross_attention and args.head != "glide":
        raise ValueError("--no-cross-attention applies to `train glide` only (its controlled baseline)")
    if args.target_layers and args.head != "glide":
        raise ValueError("--target-layers applies to `train glide` only")
    if args.soft_labels and args.head != "vanilla":
        raise ValueError("--soft-labels applies to `train vanilla` only")
    _set_threads(args)
    spec = presets[preset]
    if args.draft_vocab:
        spec = dataclasses.replace(spec, draft_vocab_size=args.draft_vocab)
    if args.target_layers:
        if len(args.target_layers) != spec.num_hidden_layers:
            raise ValueError(f"--target-layers needs one target layer per draft layer ({spec.num_hidden_layers}), "
                             f"got {len(args.target_layers)}")
        spec = dataclasses.replace(spec, target_layer_ids=tuple(args.target_layers))
    cfg = TrainConfig(Path(args.out), steps=args.steps, batch_size=args.batch_size, max_len=args.max_len, lr=args.lr,
                      eval_every=args.eval_every, eval_records=args.eval_records, seed=args.seed)
    DistillStore.open(args.data)  # a missing / foreign --data fails here, before the (slow) target load
    _log(f"loading target {args.target or 'default (Gemma-3-270M)'}")
    target, _ = load_model(args.target)
    extra = {"cross_attention": False} if args.no_cross_attention else {}
    if args.soft_labels:
        extra["soft_labels"] = args.soft_labels
    _, state = train_fn(target, args.data, cfg, spec, target_name=args.target or "gemma-3-270m",
                        progress=not args.no_progress, **extra)
    print(f"saved {args.out} (step {state.step}); best held-out acceptance: {state.best}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-cascade", description="Lossless speculative decoding for model.generate().")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_bench(sub)
    _add_corpus(sub)
    _add_demo(sub)
    _add_distill(sub)
    _add_questions(sub)
    _add_train(sub)
    return parser


def bench_config(args: argparse.Namespace):
    """The :class:`~hf_cascade.bench.BenchConfig` of parsed ``bench`` arguments."""
    from .bench import BenchConfig, parse_baselines, parse_k_matrix

    return BenchConfig(
        strategy=args.strategy,
        baselines=parse_baselines(args.baselines),
        k_matrix=parse_k_matrix(args.k_matrix),
        lenience=args.lenience,
        maxgram_lenience=args.maxgram_lenience,
        min_confidence=args.min_confidence,
        maxgram_first=args.maxgram_first,
        keep_unsure=not args.drop_unsure,
        cost_aware=args.cost_aware,
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
        target=args.target,
        drafts=list(args.draft),
        verifier=args.verifier,
        assisted_draft=args.assisted_draft,
        prompts_path=args.prompts,
        per_category=args.per_category,
        corpus=args.corpus,
    )


def _log(msg: str) -> None:
    print(f"[hf-cascade] {msg}", file=sys.stderr, flush=True)


def run_bench(args: argparse.Namespace) -> int:
    from .bench import markdown_report, run_benchmark, write_results
    from .bench.loading import load_drafts, load_model, load_prompts

    config = bench_config(args)
    _set_threads(args)
    if config.strategy == "cascade" and not config.drafts:
        raise SystemExit("hf-cascade bench: --strategy cascade needs --draft PATH (one or more, largest first)")
    if config.strategy == "hsddw" and not config.drafts:
        raise SystemExit("hf-cascade bench: --strategy hsddw needs --draft PATH (and optionally --verifier PATH)")
    if config.strategy in ("glide", "redrafter") and not config.drafts:
        raise SystemExit(f"hf-cascade bench: --strategy {config.strategy} needs --draft PATH (its trained head)")
    _log(f"loading target {config.target or 'default (Gemma-3-270M)'}")
    model, tokenizer = load_model(config.target)
    drafts = load_drafts(config.drafts, target=model)
    verifier = load_drafts([config.verifier], target=model)[0] if config.verifier else None
    assisted = load_drafts([config.assisted_draft], target=model)[0] if config.assisted_draft else None
    prompts = load_prompts(config.prompts_path, config.per_category)
    _log(f"{len(prompts)} prompts x methods {', '.join(config.methods)}, {config.max_new_tokens} new tokens")
    result = run_benchmark(config, model, tokenizer, prompts, drafts=drafts, progress=not args.no_progress,
                           verifier=verifier, assisted_draft=assisted)
    paths = write_results(result, args.out)
    print(markdown_report(result))
    print()
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "bench":
            return run_bench(args)
        if args.command == "corpus":
            return run_corpus(args)
        if args.command == "distill":
            return run_distill(args)
        if args.command == "train":
            return run_train(args)
        if args.command == "questions":
            return run_questions(args)
        from .demo import run_demo

        return run_demo(max_new_tokens=args.max_new_tokens)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        print(f"hf-cascade {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
