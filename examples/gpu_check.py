"""Check hf_cascade on your GPU: every assistant gives plain generate()'s tokens, and how fast it is.

    python examples/gpu_check.py --model google/gemma-3-270m --dtype bf16
    python examples/gpu_check.py --device cpu --max-new-tokens 16 --prompts 1 --assistants maxgram   # CPU smoke check

One command, one JSON summary (``--json``, default ``gpu_check.json``): the ``cuda`` tests of a source checkout
(``tests/cuda``, run by pytest in a subprocess on a CUDA device; ``--cuda-tests no`` leaves them out), then parity and
speed below. The summary holds the environment, the cuda tests' counts, every row (parity, each difference from
plain with its verdict and logit gap, speeds), the failures and the wall time; the exit status is 1 on any failure
(a mismatch, an error, a failed cuda test).

For each assistant of the test contract (tests/contract_registry.py: Max-Gram alone, a drafter + Max-Gram cascade,
lenience 3, Max-Gram first + cost-aware, HSDDW, GLIDE chain, GLIDE+CAPE, ReDrafter, Max-Gram trees, token
recycling) it runs greedy ``generate`` on a few prompts, in each mode of ``--modes``, and plain ``generate`` in the
same modes (each output is compared with plain ``generate``'s in its mode):

* ``eager``: the default dynamic cache;
* ``static``: ``cache_implementation="static"``, not compiled (``disable_compile=True``: on an accelerator
  transformers compiles every static-cache call otherwise);
* ``compiled``: ``cache_implementation="static"`` and ``compile_config``: ``CompileConfig()`` on an accelerator
  (inductor; on CUDA its default mode ``reduce-overhead`` takes CUDA graphs), on a CPU ``aot_eager`` without a mode
  and ``_compile_all_devices = True`` (``--compile-backend`` / ``--compile-mode`` change either). Every prompt
  runs once untimed first (compiling the query shapes it reaches); a timed run that still captures a dynamo graph
  is flagged, and reaching dynamo's recompile limit (past it a frame silently runs eagerly) is an error.

Static and compiled runs share one ``max_cache_len`` (the longest prompt plus ``--max-new-tokens``): one cache
shape for every prompt. Speeds are new tokens per second, relative to plain ``generate`` compiled (``vs compiled``,
the baseline) and with the dynamic cache (``vs eager``).

* **parity, float32**: the target loaded in float32; every output must be plain ``generate``'s, token for
  token (exit status 1 on any difference);
* **speed, ``--dtype``** (bf16 by default on a GPU): the target loaded in that dtype. Verification and plain
  decoding run different kernels, so in bf16 / fp16 a position whose two best logits are within rounding may
  flip: at the first difference from plain ``generate`` the target's logits after the plain path's prefix decide
  (``hf_cascade.parity``): a tie (the other path's token within ``--tie-ulps`` units in the last place of the
  plain path's top-1 logit) is reported with its position and logit gap, a larger gap is a failure (exit 1).

Drafters and heads: for Gemma-3-270M (``--model default`` or ``google/gemma-3-270m``) the ones shipped in
model_cards/ are used unless given; for any other target give them (local directories or Hub repo ids) with
``--drafter`` (a small causal LM with the target's tokenizer), ``--verifier`` (a second, stronger one for
HSDDW; without it HSDDW runs with the drafter alone), ``--glide`` and ``--redrafter`` (heads trained for the
target with ``hf-cascade train glide|redrafter``). Assistants whose drafter is missing are skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from hf_cascade.parity import TIE_ULPS, divergence
from hf_cascade.placement import synchronize

CARDS = Path(__file__).resolve().parent.parent / "model_cards"
CUDA_TESTS = Path(__file__).resolve().parent.parent / "tests" / "cuda"
GEMMA_270M = ("default", "google/gemma-3-270m", "google/gemma-3-270m-it")
SHIPPED = {
    "drafter": CARDS / "gemma-3-270m-drafter-xs",
    "verifier": CARDS / "gemma-3-270m-drafter-m",
    "glide": CARDS / "gemma-3-270m-glide-xs",
    "redrafter": CARDS / "gemma-3-270m-redrafter-xs",
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MODES = ("eager", "static", "compiled")

PROMPTS = [
    "def fibonacci(n):\n",
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is",
    "Question: A shop sells pencils at 3 dollars each. Tom buys 4 pencils and pays with a 20 dollar bill. "
    "How much change does he get?\nAnswer:",
    "Write a short story about a robot who learns to paint.\n",
    "import numpy as np\n\n\ndef normalize(x):\n",
    "Translate to French: The weather is nice today and we are going to the beach.\n",
    "List the planets of the solar system in order from the sun:\n1.",
    "Once upon a time, in a small village by the sea,",
]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        default="default",
        help="target: 'default' (the embedded Gemma-3-270M), a local directory or a Hub repo id",
    )
    p.add_argument(
        "--dtype",
        choices=list(DTYPES),
        default=None,
        help="dtype of the speed table (parity is checked in fp32 first); default: bf16 on a GPU, fp32 on the CPU",
    )
    p.add_argument(
        "--tie-ulps",
        type=float,
        default=TIE_ULPS,
        help="bf16/fp16 only: a difference is a tie when the other token's logit is within this many "
        "units in the last place of the plain path's top-1 logit",
    )
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--device-map", default=None, help="load the target with this device_map (e.g. 'auto')")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--prompts", type=int, default=4, help=f"how many of the {len(PROMPTS)} built-in prompts")
    p.add_argument("--repeats", type=int, default=1, help="timed runs per prompt (the fastest counts)")
    p.add_argument("--assistants", default=None, help="comma-separated names (default: all)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)} (default: all)")
    p.add_argument(
        "--compile-backend",
        default=None,
        help="compiled mode's CompileConfig backend (default: CompileConfig's, inductor; aot_eager on a CPU)",
    )
    p.add_argument(
        "--compile-mode",
        default=None,
        help="compiled mode's CompileConfig mode, 'none' for none (default: CompileConfig's, reduce-overhead; "
        "none on a CPU)",
    )
    for name in SHIPPED:
        p.add_argument(f"--{name}", default=None, help=f"{name} checkpoint (directory or Hub repo id)")
    p.add_argument(
        "--cuda-tests",
        choices=("auto", "yes", "no"),
        default="auto",
        help="run the cuda tests (tests/cuda) first: auto (default) on a CUDA device, yes, no",
    )
    p.add_argument("--json", default="gpu_check.json", metavar="PATH", help="the summary (default gpu_check.json)")
    args = p.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.dtype is None:
        args.dtype = "fp32" if args.device == "cpu" else "bf16"
    args.modes = [m for m in args.modes.split(",") if m]
    if not args.modes or any(m not in MODES for m in args.modes):
        p.error(f"--modes: comma-separated names of {', '.join(MODES)}")
    return args


# -- loading ---------------------------------------------------------------------------------------------


def load_target(args, dtype_name: str):
    dtype = DTYPES[dtype_name]
    if args.model == "default":
        from hf_cascade.models import load_default_target

        model, tok = load_default_target(dtype=dtype)
        model = model.to(args.device)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.model)
        kw = {"dtype": dtype}
        if args.device_map:
            kw["device_map"] = args.device_map
        model = AutoModelForCausalLM.from_pretrained(args.model, **kw)
        if not args.device_map:
            model = model.to(args.device)
    return model.eval(), tok


def load_drafters(args) -> dict:
    """The drafter models and heads (loaded once, fp32 on the CPU: each assistant places them on the
    target's device and dtype when it binds)."""
    from hf_cascade.loading import load_pretrained

    out = {}
    for name, shipped in SHIPPED.items():
        spec = getattr(args, name)
        if spec is None and args.model in GEMMA_270M and shipped.is_dir():
            spec = str(shipped)
        if spec is not None:
            out[name] = load_pretrained(spec, kind=name).eval()
    return out


def assistants(d: dict) -> dict:
    """name -> (factory, the drafters it needs): the registry of tests/contract_registry.py."""
    from hf_cascade import (
        CascadeAssistant,
        CascadeSettings,
        DynamicWindowAssistant,
        DynamicWindowSettings,
        GlideAssistant,
        GlideSettings,
        MaxGram,
        ReDrafterAssistant,
        ReDrafterSettings,
    )
    from hf_cascade.maxgram_tree import MaxGramTreeAssistant
    from hf_cascade.recycling import RecyclingAssistant

    def hsddw():
        return DynamicWindowAssistant(d["drafter"], d.get("verifier"), settings=DynamicWindowSettings(max_window=4))

    return {
        "maxgram": (lambda: CascadeAssistant([MaxGram()]), []),
        "drafter+maxgram": (lambda: CascadeAssistant([d["drafter"], MaxGram()]), ["drafter"]),
        "lenience3": (
            lambda: CascadeAssistant(
                [d["drafter"], MaxGram(adaptive=False, max_tokens=5)], settings=CascadeSettings(lenience=3.0)
            ),
            ["drafter"],
        ),
        "maxgram_first_cost_aware": (
            lambda: CascadeAssistant([d["drafter"], MaxGram()], settings=CascadeSettings(k_matrix=[[6, 10], [0, 10]])),
            ["drafter"],
        ),
        "hsddw": (hsddw, ["drafter"]),
        "glide": (lambda: GlideAssistant(d["glide"], settings=GlideSettings.chain()), ["glide"]),
        "glide_cape": (lambda: GlideAssistant(d["glide"]), ["glide"]),
        "redrafter": (lambda: ReDrafterAssistant(d["redrafter"], settings=ReDrafterSettings(4, 5)), ["redrafter"]),
        "maxgram_tree": (lambda: MaxGramTreeAssistant(), []),
        "recycling": (lambda: RecyclingAssistant(), []),
    }


# -- modes -----------------------------------------------------------------------------------------------


def compile_config(args, device: torch.device):
    """The compiled mode's ``CompileConfig``: transformers' defaults on an accelerator; on a CPU ``aot_eager`` without
    a mode, and ``_compile_all_devices`` (transformers compiles on a CPU only when told to); then ``--compile-backend``
    and ``--compile-mode``."""
    from transformers import CompileConfig

    cpu = device.type == "cpu"
    options = {"backend": "aot_eager", "mode": None} if cpu else {}
    if args.compile_backend:
        options["backend"] = args.compile_backend
    if args.compile_mode:
        options["mode"] = None if args.compile_mode == "none" else args.compile_mode
    config = CompileConfig(**options)
    if cpu:
        config._compile_all_devices = True
    return config


def mode_kwargs(mode: str, args, device: torch.device, max_cache_len: int) -> dict:
    """``generate()`` kwargs of ``mode``, for plain and assisted calls alike."""
    from transformers import GenerationConfig

    if mode == "eager":
        return {}
    kw = {"cache_implementation": "static"}
    if hasattr(GenerationConfig(), "max_cache_len"):  # one cache shape for every prompt
        kw["max_cache_len"] = max_cache_len
    if mode == "static":
        kw["disable_compile"] = True
    else:
        kw["compile_config"] = compile_config(args, device)
    return kw


def unique_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def strict_recompiles(compiled: bool):
    """Where dynamo's recompile limit is reached, raise (by default that frame then runs eagerly: the compiled
    timings would not be compiled ones)."""
    import contextlib

    from torch._dynamo import config

    if compiled and hasattr(config, "fail_on_recompile_limit_hit"):
        return config.patch(fail_on_recompile_limit_hit=True)
    return contextlib.nullcontext()


# -- the cuda tests --------------------------------------------------------------------------------------


def run_cuda_tests(args) -> dict:
    """The ``cuda`` tests of a source checkout (:data:`CUDA_TESTS`) in a pytest subprocess: its counts (junit XML),
    exit code and seconds; ``{"ran": False, "reason": ...}`` where they do not run (``--cuda-tests``, no CUDA
    device, no checkout)."""
    wanted = args.cuda_tests == "yes" or (args.cuda_tests == "auto" and torch.device(args.device).type == "cuda")
    if not wanted:
        return {"ran": False, "reason": "--cuda-tests no" if args.cuda_tests == "no" else f"device {args.device}"}
    if not CUDA_TESTS.is_dir():
        return {"ran": False, "reason": f"no {CUDA_TESTS} (not a source checkout)"}
    print(f"cuda tests: {CUDA_TESTS}", flush=True)
    from xml.etree import ElementTree

    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "cuda.xml"
        start = time.perf_counter()
        code = subprocess.call(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-m",
                "cuda",
                f"--junitxml={report}",
                str(CUDA_TESTS),
            ],
            cwd=CUDA_TESTS.parent.parent,
        )
        seconds = time.perf_counter() - start
        suites = list(ElementTree.parse(report).getroot().iter("testsuite")) if report.is_file() else []
        counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return {"ran": True, "exit_code": code, "seconds": round(seconds, 1), **counts}


def cuda_tests_failed(result: dict) -> bool:
    """Whether the cuda tests ran and did not pass (pytest's exit 5: nothing collected, counts as a failure)."""
    return result["ran"] and result["exit_code"] != 0


# -- running ---------------------------------------------------------------------------------------------


def timed_generate(model, ids, assistant, max_new_tokens: int, repeats: int, **kw):
    """``(output ids, fastest wall time)`` of greedy generate (optionally with ``assistant``)."""
    if assistant is not None:
        kw["assistant_model"] = assistant
    best, out = float("inf"), None
    for _ in range(max(repeats, 1)):
        synchronize(model)
        start = time.perf_counter()
        out = model.generate(ids, do_sample=False, max_new_tokens=max_new_tokens, **kw)
        synchronize(model)
        best = min(best, time.perf_counter() - start)
    return out, best


def run_method(model, prompts, assistant, kw: dict, args, timed: bool, compiled: bool) -> dict:
    """Greedy ``generate`` of every prompt (with ``assistant``, or plain) with ``kw``: outputs, seconds, new tokens,
    mean tokens per target call, and the dynamo graphs captured while timed. ``timed``: warmed up first (compiled:
    every prompt once, untimed), ``--repeats`` runs per prompt."""
    repeats = args.repeats if timed else 1
    extra = {} if assistant is None else {"assistant_model": assistant}
    with strict_recompiles(compiled):
        if timed:
            for ids in prompts if compiled else prompts[:1]:
                model.generate(
                    ids, do_sample=False, max_new_tokens=args.max_new_tokens if compiled else 4, **extra, **kw
                )
        before = unique_graphs()
        outs, seconds, tokens, per_call = [], 0.0, 0, []
        for ids in prompts:
            out, t = timed_generate(model, ids, assistant, args.max_new_tokens, repeats, **kw)
            outs.append(out[0].tolist())
            seconds += t
            tokens += out.shape[1] - ids.shape[1]
            per_call.append(assistant.last_stats.tokens_per_target_call if assistant is not None else 1.0)
    return {
        "outs": outs,
        "tps": tokens / seconds,
        "per_call": statistics.mean(per_call),
        "graphs": unique_graphs() - before if timed else 0,
    }


def judge(model, expected: list, got: list, label: str, exact: bool, ulps: float):
    """``(verdict, divergence)``: ``"same"`` (``None``), ``"tie"`` or ``"mismatch"``, printing the first difference:
    in float32 (``exact``) every difference is a mismatch; otherwise the target's logits after the plain path's
    prefix decide (:func:`hf_cascade.parity.divergence`)."""
    if got == expected:
        return "same", None
    d = divergence(model, expected, got, ulps=ulps)
    where = (
        f"{label}, first difference at position {d.position} (plain {expected[d.position : d.position + 5]}, "
        f"got {got[d.position : d.position + 5]})"
    )
    gaps = f"top-1 - top-2 logit {d.gap:.4g}, top-1 - its token {d.got_gap:.4g}, tie tolerance {d.tolerance:.3g}"
    verdict = "mismatch" if exact or not d.tie else "tie"
    print(f"  {'tie' if verdict == 'tie' else 'MISMATCH'} {where}: {gaps}", flush=True)
    return verdict, d


def parity_text(verdicts: list) -> str:
    """``"same/n"``, then the ties and mismatches and the first divergence's position and logit gap (top-1 minus
    the other path's token)."""
    kinds = [v for v, _ in verdicts]
    text = f"{kinds.count('same')}/{len(kinds)}"
    text += f" +{kinds.count('tie')} tie" if "tie" in kinds else ""
    text += f" {kinds.count('mismatch')} MISMATCH" if "mismatch" in kinds else ""
    first = next((d for _, d in verdicts if d is not None), None)
    return text + (f" @{first.position} gap {first.got_gap:.3g}" if first is not None else "")


def run_assistants(model, prompts, table, wanted, drafters, args, exact: bool, timed: bool):
    """Plain ``generate`` and every wanted assistant in every mode of ``--modes`` on ``model``: ``(rows, failures)``,
    a row per method and mode ``(method, mode, parity, tokens/s, vs compiled, vs eager, tokens per call)``. Each
    assistant is compared with plain ``generate`` in the same mode (``exact``: every difference fails, float32;
    else ties are told from mismatches, :func:`judge`); plain static / compiled with plain eager (never a failure)."""
    from hf_cascade.core.static import static_rollback_supported

    device = prompts[0].device
    max_cache_len = max(p.shape[1] for p in prompts) + args.max_new_tokens
    modes = ["eager"] + [m for m in args.modes if m != "eager"]  # plain eager: the reference of the others
    plain, rows, failures = {}, [], 0
    for mode in modes:
        kw = mode_kwargs(mode, args, device, max_cache_len)
        try:
            plain[mode] = r = run_method(model, prompts, None, kw, args, timed, mode == "compiled")
        except Exception as exc:
            if mode == "eager":
                raise
            rows.append(("plain generate", mode, f"ERROR {type(exc).__name__}: {str(exc)[:60]}", None, []))
            continue
        verdicts = (
            [
                judge(model, e, g, f"plain [{mode}]", exact, args.tie_ulps)
                for e, g in zip(plain["eager"]["outs"], r["outs"])
            ]
            if mode != "eager"
            else []
        )
        rows.append(("plain generate", mode, parity_text(verdicts) if verdicts else "-", r, verdicts))
    for name in wanted:
        make, needs = table[name]
        missing = [n for n in needs if n not in drafters]
        for mode in modes:
            if mode not in args.modes:
                continue
            if missing or mode not in plain or (mode != "eager" and not static_rollback_supported()):
                why = (
                    f"no --{missing[0]}"
                    if missing
                    else "no plain baseline"
                    if mode not in plain
                    else "static caches need transformers >= 5"
                )
                rows.append((name, mode, f"skipped ({why})", None, []))
                continue
            try:
                kw = mode_kwargs(mode, args, device, max_cache_len)
                r = run_method(model, prompts, make(), kw, args, timed, mode == "compiled")
                verdicts = [
                    judge(model, e, g, f"{name} [{mode}], prompt {i}", exact, args.tie_ulps)
                    for i, (e, g) in enumerate(zip(plain[mode]["outs"], r["outs"]))
                ]
                failures += sum(v == "mismatch" for v, _ in verdicts)
                rows.append((name, mode, parity_text(verdicts), r, verdicts))
            except Exception as exc:  # report and go on with the others
                failures += 1
                rows.append((name, mode, f"ERROR {type(exc).__name__}: {str(exc)[:80]}", None, []))
            print(f"  {name} [{mode}]: {rows[-1][2]}", flush=True)

    def ratio(r, m):
        return r["tps"] / plain[m]["tps"] if r is not None and m in plain else None

    return [
        {
            "method": method,
            "mode": mode,
            "parity": parity + (f" ({r['graphs']} graph(s) compiled while timed)" if r and r["graphs"] else ""),
            "tokens_per_second": r and r["tps"],
            "vs_compiled": ratio(r, "compiled"),
            "vs_eager": ratio(r, "eager"),
            "tokens_per_call": r and r["per_call"],
            "differences": [
                {"prompt": i, "verdict": v, **_finite(dataclasses.asdict(d))}
                for i, (v, d) in enumerate(verdicts)
                if d is not None
            ],
        }
        for method, mode, parity, r, verdicts in rows
    ], failures


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    import transformers

    import hf_cascade  # noqa: F401  (installs the generate() hook)

    gpu = torch.cuda.get_device_name(torch.device(args.device)) if args.device.startswith("cuda") else None
    print(
        f"torch {torch.__version__}, device {args.device}"
        + (f" ({gpu})" if gpu else "")
        + f", dtype {args.dtype} (parity in fp32), target {args.model}",
        flush=True,
    )
    summary = {
        "environment": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "device": args.device,
            "device_name": gpu or f"CPU ({platform.machine()})",
            "dtype": args.dtype,
            "target": args.model,
            "prompts": args.prompts,
            "max_new_tokens": args.max_new_tokens,
            "modes": args.modes,
        },
        "cuda_tests": run_cuda_tests(args),
    }
    drafters = load_drafters(args)
    print("drafters: " + (", ".join(f"{k}={getattr(args, k) or SHIPPED[k].name}" for k in drafters) or "none"))
    table = assistants(drafters)
    wanted = args.assistants.split(",") if args.assistants else list(table)
    unknown = [w for w in wanted if w not in table]
    if unknown:
        print(f"unknown assistants {unknown}; known: {list(table)}", file=sys.stderr)
        return 2

    failures, exact, tables = 0, {}, {}
    for dtype_name in dict.fromkeys(["fp32", args.dtype]):  # parity in fp32 first, then the speed dtype
        print(f"\n{dtype_name}:", flush=True)
        torch._dynamo.reset()  # the other dtype's graphs would count against the recompile limit
        model, tok = load_target(args, dtype_name)
        device = model.get_input_embeddings().weight.device
        if device.type == "meta":
            device = torch.device(args.device)
        prompts = [tok(p, return_tensors="pt").input_ids.to(device) for p in PROMPTS[: args.prompts]]
        timed = dtype_name == args.dtype
        rows, failed = run_assistants(
            model, prompts, table, wanted, drafters, args, exact=dtype_name == "fp32", timed=timed
        )
        failures += failed
        tables[dtype_name] = rows
        if not timed:
            exact = {(row["method"], row["mode"]): row["parity"] for row in rows}
        del model  # before the next dtype's copy is loaded
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    print()
    print_table(rows, exact, args.dtype)
    cuda = summary["cuda_tests"]
    failures += cuda_tests_failed(cuda)
    print(
        f"\n{args.prompts} prompts x {args.max_new_tokens} new tokens, greedy, {args.device}; parity in fp32, speed in "
        f"{args.dtype}; vs compiled / vs eager: tokens/s over plain generate compiled / eager; "
        + ("all outputs identical to plain generate (or ties)" if not failures else f"{failures} FAILURE(S)")
    )
    print(
        "cuda tests: "
        + (
            f"{cuda['passed']} passed, {cuda['failures'] + cuda['errors']} failed, {cuda['skipped']} "
            f"skipped (exit {cuda['exit_code']})"
            if cuda["ran"]
            else f"not run ({cuda['reason']})"
        )
    )
    summary.update(rows=tables, failures=failures, seconds=round(time.perf_counter() - start, 1), ok=not failures)
    Path(args.json).write_text(json.dumps(summary, indent=1, allow_nan=False) + "\n")
    print(f"wrote {args.json} ({summary['seconds']:.0f} s)")
    return 1 if failures else 0


def _finite(fields: dict) -> dict:
    """``fields`` with infinite floats as strings (a logit gap where a sequence had ended), for strict JSON."""
    return {k: str(v) if isinstance(v, float) and not math.isfinite(v) else v for k, v in fields.items()}


def print_table(rows, exact: dict, dtype: str) -> None:
    """One line per method and mode: speeds, then parity (float32, when it ran apart, and the speed dtype)."""

    def num(v, f, suffix=""):
        return format(v, f) + suffix if v is not None else "-"

    print(
        f"{'method':<26} {'mode':<9} {'tokens/s':>9} {'vs compiled':>12} {'vs eager':>9} {'tokens/call':>12}  "
        + (f"{'fp32 parity':<24} " if exact else "")
        + f"{dtype} parity"
    )
    for row in rows:
        method, mode = row["method"], row["mode"]
        print(
            f"{method:<26} {mode:<9} {num(row['tokens_per_second'], '9.1f'):>9} "
            f"{num(row['vs_compiled'], '.2f', 'x'):>12} {num(row['vs_eager'], '.2f', 'x'):>9} "
            f"{num(row['tokens_per_call'], '12.2f'):>12}  "
            + (f"{exact.get((method, mode), '-'):<24} " if exact else "")
            + row["parity"]
        )


if __name__ == "__main__":
    sys.exit(main())
