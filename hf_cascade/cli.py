"""``hf-cascade``: command line entry point (``bench``, ``cards``, ``corpus``, ``demo``, ``distill``, ``questions``,
``train``).

    hf-cascade bench --per-category 1 --max-new-tokens 64 --baselines pld,economize --out bench_out
    hf-cascade demo
    hf-cascade cards --sync      # model_cards/*/*.py written from hf_cascade/heads/

Only this module and :mod:`hf_cascade.demo` print; the library returns data.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .bench.command import add_bench_arguments, bench_config  # noqa: F401  (bench_config: part of the CLI's API)


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
        help="compare plain generate, baselines and hf_cascade's strategies on Spec-Bench prompts",
        description="Methods (the baselines and every --strategy) are interleaved prompt by prompt (rotating "
        "order) after "
        "one warm-up generate each; speedups are against plain generate (and plain-kernels) in the same run. "
        "`hf-cascade bench --strategy all --baselines plain-kernels,maxgram` measures every strategy with its defaults "
        "and, on the default target, its shipped head. `hf-cascade bench --overhead` measures instead the library's "
        "host time and device reads per target call on a tiny target whose forward is nearly free (the GPU regime); "
        "`hf-cascade bench --compare A B` compares two earlier runs (e.g. two commits) prompt by prompt.",
    )
    add_bench_arguments(p)
    _add_run_options(p)


def _add_cards(sub) -> None:
    p = sub.add_parser(
        "cards",
        help="write the shipped folders' remote code (model_cards/*/*.py) from hf_cascade/heads/, or check it",
        description="Every folder of model_cards/ with a config.json carries its head's configuration and modeling "
        "files as remote code: copies of hf_cascade/heads/. --sync writes them from there (and removes .py files no "
        "head module names); --check lists the copies that differ and exits 1 if any does.",
    )
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--sync", action="store_true", help="write the copies from hf_cascade/heads/")
    mode.add_argument("--check", action="store_true", help="list the copies that differ; exit 1 if any")
    p.add_argument(
        "--root", default=None, metavar="DIR", help="the folders' parent (default: the clone's model_cards/)"
    )


def run_cards(args: argparse.Namespace) -> int:
    from .heads.cards import sync_cards

    changed = sync_cards(args.root, write=args.sync)
    for path in changed:
        print(("wrote " if args.sync and path.exists() else "removed " if args.sync else "differs: ") + str(path))
    if args.check and changed:
        print(f"{len(changed)} file(s) differ from hf_cascade/heads/: run hf-cascade cards --sync", file=sys.stderr)
        return 1
    return 0


def _add_demo(sub) -> None:
    p = sub.add_parser(
        "demo", help="stream answers of the default model with CascadeAssistant([MaxGram()]) and time it"
    )
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
    p.add_argument(
        "--prompts",
        action="extend",
        nargs="+",
        default=None,
        metavar="FILE",
        help="JSONL prompt files (fields turns / instruction / question / prompt / text)",
    )
    p.add_argument(
        "--dataset",
        default=None,
        metavar="ID_OR_PATH",
        help="a `datasets` dataset instead: Hub id, save_to_disk folder or data file (chats: first user "
        "turn; default without shared/data/train_prompts: HuggingFaceH4/ultrachat_200k)",
    )
    p.add_argument("--split", default=None, help="the dataset's split (default: its only one, or 'train')")
    p.add_argument("--field", default=None, help="the rows' prompt field (default: found from the layout)")
    p.add_argument(
        "--prompt-format",
        choices=("plain", "chat"),
        default=None,
        help="plain: the package's completion template; chat: the tokenizer's chat template "
        "(default: chat for --dataset when the tokenizer has one, else plain)",
    )
    p.add_argument("--max-new-tokens", type=int, default=128, help="response length cap (default 128)")
    p.add_argument("--batch-size", type=int, default=16, help="prompts per batched generate (default 16)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="stop once N prompts are stored")
    p.add_argument("--hidden-states", action="store_true", help="also store the target's last hidden states")
    p.add_argument(
        "--teacher-forced",
        action="store_true",
        help="no generation: the training files' prompts with their own answers (and long contexts), one "
        "forward each, stored with the target's last hidden states into a sharded store (default "
        "files: every one of shared/data/train_prompts; --prompts FILE for others)",
    )
    p.add_argument("--max-len", type=int, default=512, help="--teacher-forced: tokens per record (default 512)")
    p.add_argument(
        "--batch-tokens", type=int, default=4096, help="--teacher-forced: padded tokens per forward (default 4096)"
    )
    p.add_argument(
        "--shard-tokens", type=int, default=1 << 20, help="--teacher-forced: tokens per shard (default 1048576)"
    )
    p.add_argument(
        "--max-tokens", type=int, default=None, metavar="N", help="--teacher-forced: stop once N tokens are stored"
    )
    p.add_argument(
        "--no-speculative",
        dest="speculative",
        action="store_false",
        help="plain batched generate (default: the package's batched speculative decoding with Max-Gram "
        "drafts, drafting only where its gate expects a gain; greedy either way)",
    )
    from .training.launch import add_process_options

    add_process_options(p)  # several processes: disjoint prompt shards, merged into one store
    _add_run_options(p)


def _maxgram_assistant():
    """``distill``'s assistant: Max-Gram drafts in the batched core, which drafts only where its gate expects a gain."""
    from . import CascadeAssistant, MaxGram

    return CascadeAssistant([MaxGram()])


def run_distill(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .data import PROMPT_FORMAT
    from .training import DistillConfig, distill
    from .training.accel import num_processes, place_target
    from .training.launch import check_processes, device_map
    from .training.sources import CHAT, distill_prompts

    check_processes(args, num_processes())
    _set_threads(args)
    if args.teacher_forced:
        return _run_teacher_forced(args)
    prompts, dataset = distill_prompts(args.prompts, args.dataset, args.split, args.field, args.limit, _log)
    _log(f"{len(prompts)} training prompts (Spec-Bench questions excluded); loading target {args.target or 'default'}")
    model, tokenizer = _load_target(args.target, device_map(args.target_device_map))
    place_target(model)
    chat = args.prompt_format == "chat" or (
        args.prompt_format is None and dataset and bool(getattr(tokenizer, "chat_template", None))
    )
    cfg = DistillConfig(
        Path(args.out),
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        hidden_states=args.hidden_states,
        limit=args.limit,
        prompt_format=CHAT if chat else PROMPT_FORMAT,
        assistant=_maxgram_assistant if args.speculative else None,
    )
    store = distill(model, tokenizer, cfg, prompts, target_name=args.target or "default", progress=not args.no_progress)
    from .training.accel import is_main_process

    if is_main_process():
        print(f"{len(store)} sequences, {store.num_tokens} tokens in {args.out}")
    return 0


def _run_teacher_forced(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .data import PROMPT_FORMAT
    from .training.sources import CHAT, training_texts
    from .training.teacher import TeacherConfig, teacher_forced

    if args.dataset is not None:
        raise ValueError("--teacher-forced reads JSONL files (--prompts FILE ...), not --dataset")
    texts = training_texts(args.prompts)
    _log(f"{len(texts)} training texts (Spec-Bench excluded); loading target {args.target or 'default'}")
    model, tokenizer = _load_target(args.target, None)
    cfg = TeacherConfig(
        Path(args.out),
        prompt_format=CHAT if args.prompt_format == "chat" else PROMPT_FORMAT,
        max_len=args.max_len,
        batch_tokens=args.batch_tokens,
        shard_tokens=args.shard_tokens,
        limit=args.limit,
        max_tokens=args.max_tokens,
    )
    store = teacher_forced(
        model, tokenizer, cfg, texts, target_name=args.target or "default", progress=not args.no_progress
    )
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
    p.add_argument("--out", required=True, metavar="FILE", help='JSONL file of {"question": ...} lines (appended)')
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
        "target's last hidden state (ReDrafterAssistant). Evaluates held-out greedy acceptance every "
        "--eval-every steps "
        "and keeps the best checkpoint.",
    )
    p.add_argument("head", choices=["vanilla", "glide", "redrafter"])
    p.add_argument("--data", required=True, metavar="DIR", help="directory written by `hf-cascade distill`")
    p.add_argument("--out", required=True, metavar="DIR", help="checkpoint directory (Hub layout)")
    p.add_argument("--target", default=None, help="target model (as for bench; default Gemma-3-270M)")
    p.add_argument(
        "--preset",
        default=None,
        help="size preset: vanilla xs, s, m (default s); glide xs, s (default xs); redrafter xs, s (default s)",
    )
    p.add_argument(
        "--no-cross-attention",
        action="store_true",
        help="glide: train the paper's controlled baseline, the same draft without cross-attention",
    )
    p.add_argument(
        "--target-layers",
        type=int,
        nargs="+",
        default=None,
        metavar="L",
        help="glide: the target layer each draft layer reads (default: the paper's l = N_T - N_D + m)",
    )
    p.add_argument(
        "--draft-vocab", type=int, default=None, metavar="N", help="reduced vocabulary size (default: preset's)"
    )
    p.add_argument(
        "--soft-labels",
        type=int,
        default=0,
        metavar="K",
        help="vanilla: also distil the target's top-K next-token distribution at every position (one "
        "teacher-forced pass over --data, cached there; 0 = greedy tokens only)",
    )
    p.add_argument(
        "--unroll",
        type=int,
        default=1,
        metavar="K",
        help="glide, redrafter: training-time test, drafted positions 2..K also trained fed the head's own "
        "earlier predictions (HASS / EAGLE-3; default 1: teacher forcing only)",
    )
    p.add_argument(
        "--feature-weight",
        type=float,
        default=0.0,
        metavar="W",
        help="glide, redrafter: add W x the smooth-L1 regression of the head's feature onto the target's "
        "last hidden state (EAGLE; needs a store with hidden states; default 0: off)",
    )
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch-size", type=int, default=16, help="sequences per step, all processes together (default 16)")
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-records", type=int, default=48)
    p.add_argument(
        "--measure-prompts",
        type=int,
        default=8,
        metavar="N",
        help="after training, greedy generate with the saved head on N held-out prompts: tokens per target "
        "call and parity with plain generate, into trainer_state.json and the card (0: skip)",
    )
    p.add_argument("--seed", type=int, default=0)
    from .training.launch import add_train_options

    add_train_options(p)
    _add_run_options(p)


def _trainers() -> dict:
    """``head -> (presets, default preset, train function)`` of ``hf-cascade train``."""
    from .training.run import PRESETS, train_vanilla
    from .training.run_glide import GLIDE_PRESETS, train_glide
    from .training.run_redrafter import DEFAULT_PRESET, train_redrafter
    from .training.run_redrafter import PRESETS as REDRAFTER_PRESETS

    return {
        "vanilla": (PRESETS, "s", train_vanilla),
        "glide": (GLIDE_PRESETS, "xs", train_glide),
        "redrafter": (REDRAFTER_PRESETS, DEFAULT_PRESET, train_redrafter),
    }


def run_train(args: argparse.Namespace) -> int:
    import dataclasses
    from pathlib import Path

    import torch

    from .training.accel import check_layout, is_main_process, num_processes, place_target
    from .training.launch import check_processes, device_map
    from .training.loop import TrainConfig
    from .training.sharding import requested
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
    if (args.unroll != 1 or args.feature_weight) and args.head == "vanilla":
        raise ValueError("--unroll and --feature-weight apply to `train glide` and `train redrafter`")
    if args.unroll < 1 or args.feature_weight < 0:
        raise ValueError(f"--unroll must be >= 1 and --feature-weight >= 0, got {args.unroll}, {args.feature_weight}")
    processes = num_processes()
    check_processes(args, processes)
    check_layout(args.batch_size, args.grad_accum, args.mixed_precision, processes)
    requested(args.fsdp, processes)  # a sharding strategy FSDP cannot apply fails before the target loads
    _set_threads(args)
    spec = presets[preset]
    if args.draft_vocab:
        spec = dataclasses.replace(spec, draft_vocab_size=args.draft_vocab)
    if args.target_layers:
        if len(args.target_layers) != spec.num_hidden_layers:
            raise ValueError(
                f"--target-layers needs one target layer per draft layer ({spec.num_hidden_layers}), "
                f"got {len(args.target_layers)}"
            )
        spec = dataclasses.replace(spec, target_layer_ids=tuple(args.target_layers))
    cfg = TrainConfig(
        Path(args.out),
        steps=args.steps,
        batch_size=args.batch_size,
        max_len=args.max_len,
        lr=args.lr,
        eval_every=args.eval_every,
        eval_records=args.eval_records,
        seed=args.seed,
        grad_accum=args.grad_accum,
        mixed_precision=args.mixed_precision,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        fsdp=args.fsdp,
        unroll=args.unroll,
        feature_weight=args.feature_weight,
    )
    DistillStore.open(args.data)  # a missing / foreign --data fails here, before the (slow) target load
    if args.resume and not (Path(args.out) / "checkpoint").is_dir():
        raise ValueError(
            f"--resume: no checkpoint in {Path(args.out) / 'checkpoint'} (written every --checkpoint-every "
            "steps); run without --resume to start over"
        )
    _log(f"loading target {args.target or 'default (Gemma-3-270M)'}")
    target, _ = _load_target(args.target, device_map(args.target_device_map))
    place_target(target)
    torch.manual_seed(args.seed)  # the head's initialisation (every process builds the same one)
    extra = {"cross_attention": False} if args.no_cross_attention else {}
    if args.soft_labels:
        extra["soft_labels"] = args.soft_labels
    _, state = train_fn(
        target, args.data, cfg, spec, target_name=args.target or "gemma-3-270m", progress=not args.no_progress, **extra
    )
    if is_main_process():  # it evaluates and saves
        print(f"saved {args.out} (step {state.step}); best held-out acceptance: {state.best}")
        if args.measure_prompts > 0:  # then what the saved head does in generate (main process only)
            from .bench.heldout import measure_generation, record_generation

            measured = measure_generation(
                target,
                args.out,
                args.head,
                args.data,
                args.eval_records,
                args.measure_prompts,
                progress=not args.no_progress,
            )
            record_generation(args.out, measured)
            print(f"held-out generate: {measured}")
    return 0


def _load_target(spec, device_map):
    """``load_model(spec)``, with ``device_map`` only when one is asked for (and, in one of several processes, the
    memory of this process's GPUs: :func:`hf_cascade.training.accel.target_max_memory`); accelerate's FSDP request
    hidden from transformers (:func:`hf_cascade.training.sharding.hidden_from_libraries`)."""
    from .bench.loading import load_model
    from .training.accel import target_max_memory
    from .training.sharding import hidden_from_libraries

    kwargs = {} if device_map is None else {"device_map": device_map}
    memory = None if device_map is None else target_max_memory(device_map)
    if memory is not None:
        kwargs["max_memory"] = memory
    with hidden_from_libraries():  # every process loads all of the target, whatever FSDP config launched it
        return load_model(spec, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-cascade", description="Lossless speculative decoding for model.generate()."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_bench(sub)
    _add_cards(sub)
    _add_corpus(sub)
    _add_demo(sub)
    _add_distill(sub)
    _add_questions(sub)
    _add_train(sub)
    return parser


def _log(msg: str) -> None:
    if os.environ.get("RANK", "0") != "0":  # one line per run from a launched run's processes
        return
    print(f"[hf-cascade] {msg}", file=sys.stderr, flush=True)


def run_bench(args: argparse.Namespace) -> int:
    from .bench.command import run

    _set_threads(args)
    return run(args, log=_log)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "num_processes", 1) > 1:
            from .training.launch import launched, relaunch

            if not launched():
                return relaunch(argv, args)
        if args.command == "bench":
            return run_bench(args)
        if args.command == "cards":
            return run_cards(args)
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


if __name__ == "__main__":  # also how `accelerate launch -m hf_cascade.cli` and --num-processes start it
    status = main()
    from .training.launch import launched, leave_process_group

    if launched():
        leave_process_group(finished=status == 0)
    sys.exit(status)
