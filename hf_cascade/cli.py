"""``hf-cascade``: command line entry point (``bench`` and ``demo``).

    hf-cascade bench --per-category 1 --max-new-tokens 64 --baselines pld,economize --out bench_out
    hf-cascade demo

Only this module and :mod:`hf_cascade.demo` print; the library returns data.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence


def _add_bench(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="compare plain generate, baselines and an hf_cascade strategy on Spec-Bench prompts",
        description="Methods are interleaved prompt by prompt (rotating order) after one warm-up generate each; "
        "speedups are against plain generate in the same run.",
    )
    p.add_argument("--target", default=None,
                   help="target model: default (embedded Gemma-3-270M), smollm2, a local HF directory, or gguf:PATH")
    p.add_argument("--strategy", choices=["maxgram", "cascade"], default="maxgram",
                   help="maxgram = CascadeAssistant([MaxGram()]); cascade = CascadeAssistant([*drafts, MaxGram()])")
    p.add_argument("--draft", action="extend", nargs="+", default=[], metavar="PATH",
                   help="draft model(s), largest first (HF directory, gguf:PATH, smollm2, self:N = the target's first N layers); "
                        "needed by --strategy cascade and the hf-assisted baseline")
    p.add_argument("--k-matrix", default=None, metavar="JSON",
                   help="K-matrix of the cascade as JSON (e.g. '[[2,10],[0,10]]') or a JSON file")
    p.add_argument("--lenience", type=float, default=1.0, help="lenience between drafters (>= 1; default 1)")
    p.add_argument("--baselines", default="plain",
                   help="comma list from plain,pld,pld-tuned,hf-assisted,economize (plain is always included)")
    p.add_argument("--prompts", default=None, metavar="FILE", help="Spec-Bench question.jsonl (default: the bundled one)")
    p.add_argument("--per-category", type=int, default=3, metavar="N", help="prompts per Spec-Bench category (default 3)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt (default 128)")
    p.add_argument("--sampling", action="store_true", help="do_sample=True with --temperature (default: greedy)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default 0.7)")
    p.add_argument("--seed", type=int, default=0, help="random seed (reset per prompt and method)")
    p.add_argument("--out", default="bench_results", metavar="DIR", help="output directory (default bench_results)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="stream answers of the default model with CascadeAssistant([MaxGram()]) and time it")
    p.add_argument("--max-new-tokens", type=int, default=96, help="new tokens per prompt (default 96)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-cascade", description="Lossless speculative decoding for model.generate().")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_bench(sub)
    _add_demo(sub)
    return parser


def bench_config(args: argparse.Namespace):
    """The :class:`~hf_cascade.bench.BenchConfig` of parsed ``bench`` arguments."""
    from .bench import BenchConfig, parse_baselines, parse_k_matrix

    return BenchConfig(
        strategy=args.strategy,
        baselines=parse_baselines(args.baselines),
        k_matrix=parse_k_matrix(args.k_matrix),
        lenience=args.lenience,
        max_new_tokens=args.max_new_tokens,
        sampling=args.sampling,
        temperature=args.temperature,
        seed=args.seed,
        target=args.target,
        drafts=list(args.draft),
        prompts_path=args.prompts,
        per_category=args.per_category,
    )


def _log(msg: str) -> None:
    print(f"[hf-cascade] {msg}", file=sys.stderr, flush=True)


def run_bench(args: argparse.Namespace) -> int:
    from .bench import markdown_report, run_benchmark, write_results
    from .bench.loading import load_drafts, load_model, load_prompts

    config = bench_config(args)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if config.strategy == "cascade" and not config.drafts:
        raise SystemExit("hf-cascade bench: --strategy cascade needs --draft PATH (one or more, largest first)")
    _log(f"loading target {config.target or 'default (Gemma-3-270M)'}")
    model, tokenizer = load_model(config.target)
    drafts = load_drafts(config.drafts, target=model)
    prompts = load_prompts(config.prompts_path, config.per_category)
    _log(f"{len(prompts)} prompts x methods {', '.join(config.methods)}, {config.max_new_tokens} new tokens")
    result = run_benchmark(config, model, tokenizer, prompts, drafts=drafts, progress=not args.no_progress)
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
        from .demo import run_demo

        return run_demo(max_new_tokens=args.max_new_tokens)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        print(f"hf-cascade {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
