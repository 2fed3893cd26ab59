"""Check hf_cascade on your GPU: every assistant gives plain generate()'s tokens, and how fast it is.

    python examples/gpu_check.py --model google/gemma-3-270m --dtype bf16
    python examples/gpu_check.py --model default --max-new-tokens 16 --prompts 2      # CPU, embedded target

For each assistant of the test contract (tests/test_contract.py: Max-Gram alone, a drafter + Max-Gram
cascade, a cascade with lenience 3, Max-Gram first + cost-aware, HSDDW, GLIDE chain, GLIDE+CAPE, ReDrafter,
Max-Gram trees) it runs greedy ``generate`` on a few prompts on the chosen device:

* **parity, float32**: the target loaded in float32; every output must be plain ``generate``'s, token for
  token (exit status 1 on any difference);
* **speed, ``--dtype``** (bf16 by default on a GPU): the target loaded in that dtype, a speed table (new tokens
  per second, speedup over plain generate, tokens per target call). Verification and plain decoding run
  different kernels, so in bf16 / fp16 a position whose two best logits are within rounding may flip: each
  output is compared with plain ``generate``'s, and at the first difference the target's logits after the plain
  path's prefix decide (``hf_cascade.parity``): a tie (the other path's token within ``--tie-ulps`` units in the
  last place of the plain path's top-1 logit) is reported, a larger gap is a failure (exit status 1).
  On CUDA, plain ``generate`` with a static cache compiled (``compile_config``) is timed as a second baseline
  when the installed transformers supports it.

Drafters and heads: for Gemma-3-270M (``--model default`` or ``google/gemma-3-270m``) the ones shipped in
model_cards/ are used unless given; for any other target give them (local directories or Hub repo ids) with
``--drafter`` (a small causal LM with the target's tokenizer), ``--verifier`` (a second, stronger one for
HSDDW; without it HSDDW runs with the drafter alone), ``--glide`` and ``--redrafter`` (heads trained for the
target with ``hf-cascade train glide|redrafter``). Assistants whose drafter is missing are skipped.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from hf_cascade.parity import TIE_ULPS, divergence
from hf_cascade.placement import synchronize

CARDS = Path(__file__).resolve().parent.parent / "model_cards"
GEMMA_270M = ("default", "google/gemma-3-270m", "google/gemma-3-270m-it")
SHIPPED = {
    "drafter": CARDS / "gemma-3-270m-drafter-xs",
    "verifier": CARDS / "gemma-3-270m-drafter-m",
    "glide": CARDS / "gemma-3-270m-glide-xs",
    "redrafter": CARDS / "gemma-3-270m-redrafter-xs",
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

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
    p.add_argument("--model", default="default",
                   help="target: 'default' (the embedded Gemma-3-270M), a local directory or a Hub repo id")
    p.add_argument("--dtype", choices=list(DTYPES), default=None,
                   help="dtype of the speed table (parity is checked in fp32 first); default: bf16 on a GPU, fp32 on the CPU")
    p.add_argument("--tie-ulps", type=float, default=TIE_ULPS,
                   help="bf16/fp16 only: a difference is a tie when the other token's logit is within this many "
                        "units in the last place of the plain path's top-1 logit")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--device-map", default=None, help="load the target with this device_map (e.g. 'auto')")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--prompts", type=int, default=4, help=f"how many of the {len(PROMPTS)} built-in prompts")
    p.add_argument("--repeats", type=int, default=1, help="timed runs per prompt (the fastest counts)")
    p.add_argument("--assistants", default=None, help="comma-separated names (default: all)")
    for name in SHIPPED:
        p.add_argument(f"--{name}", default=None, help=f"{name} checkpoint (directory or Hub repo id)")
    args = p.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.dtype is None:
        args.dtype = "fp32" if args.device == "cpu" else "bf16"
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
    """name -> (factory, the drafters it needs): the registry of tests/test_contract.py."""
    from hf_cascade import CascadeAssistant, DynamicWindowAssistant, GlideAssistant, MaxGram, ReDrafterAssistant
    from hf_cascade.maxgram_tree import MaxGramTreeAssistant

    def hsddw():
        if "verifier" in d:
            return DynamicWindowAssistant(d["drafter"], d["verifier"], max_window=4)
        return DynamicWindowAssistant(d["drafter"], max_window=4)

    return {
        "maxgram": (lambda: CascadeAssistant([MaxGram()]), []),
        "drafter+maxgram": (lambda: CascadeAssistant([d["drafter"], MaxGram()]), ["drafter"]),
        "lenience3": (lambda: CascadeAssistant([d["drafter"], MaxGram(adaptive=False, max_tokens=5)], lenience=3.0),
                      ["drafter"]),
        "maxgram_first_cost_aware": (lambda: CascadeAssistant([d["drafter"], MaxGram()], k_matrix=[[6, 10], [0, 10]],
                                                              maxgram_first=True, cost_aware=True), ["drafter"]),
        "hsddw": (hsddw, ["drafter"]),
        "glide": (lambda: GlideAssistant(d["glide"], cape=False), ["glide"]),
        "glide_cape": (lambda: GlideAssistant(d["glide"], cape=True), ["glide"]),
        "redrafter": (lambda: ReDrafterAssistant(d["redrafter"], beam_width=4, beam_length=5), ["redrafter"]),
        "maxgram_tree": (lambda: MaxGramTreeAssistant(), []),
    }


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


def compiled_kwargs(model) -> dict | None:
    """generate() kwargs for plain decoding with a static cache, compiled (``None``: not on CUDA, or this
    transformers has no ``CompileConfig``)."""
    try:
        from transformers import CompileConfig
    except ImportError:
        return None
    if model.device.type != "cuda":
        return None
    return {"cache_implementation": "static", "compile_config": CompileConfig()}


def judge(model, expected: list, got: list, name: str, i: int, exact: bool, ulps: float) -> str:
    """``"same"``, ``"tie"`` or ``"mismatch"``, printing the first difference: in float32 (``exact``) every
    difference is a mismatch; otherwise the target's logits after the plain path's prefix decide."""
    if got == expected:
        return "same"
    d = divergence(model, expected, got, ulps=ulps)
    where = f"{name}, prompt {i}: first difference at position {d.position} (plain {expected[d.position:d.position + 5]}, " \
            f"{name} {got[d.position:d.position + 5]})"
    if exact:
        print(f"  MISMATCH {where}", flush=True)
        return "mismatch"
    gaps = f"top-1 - top-2 logit {d.gap:.4g}, top-1 - {name}'s token {d.got_gap:.4g}, tie tolerance {d.tolerance:.3g}"
    print(f"  {'tie' if d.tie else 'MISMATCH'} {where}: {gaps}", flush=True)
    return "tie" if d.tie else "mismatch"


def run_assistants(model, prompts, table, wanted, drafters, args, exact: bool, timed: bool):
    """Greedy generate with every wanted assistant on ``model``: ``(rows, failures)``, a row per assistant
    ``(name, parity, tokens/s, speedup, tokens per call)``, the plain baselines first. ``exact``: every difference
    from plain generate is a failure (float32), else ties are told from mismatches (:func:`judge`). ``timed``: the
    run whose speeds are reported (``--repeats`` runs per prompt, and the compiled baseline where supported)."""
    repeats = args.repeats if timed else 1
    model.generate(prompts[0], do_sample=False, max_new_tokens=4)      # warm-up (kernels, CUDA context) untimed
    plain_out, plain_time = [], []
    for ids in prompts:
        out, seconds = timed_generate(model, ids, None, args.max_new_tokens, repeats)
        plain_out.append(out[0].tolist())
        plain_time.append(seconds)
    plain_tokens = sum(len(o) - p.shape[1] for o, p in zip(plain_out, prompts))
    rows = [("plain generate", "-", plain_tokens / sum(plain_time), 1.0, 1.0)]

    failures = 0
    for name in wanted:
        make, needs = table[name]
        missing = [n for n in needs if n not in drafters]
        if missing:
            rows.append((name, f"skipped (no --{missing[0]})", None, None, None))
            continue
        try:
            assistant = make()
            model.generate(prompts[0], do_sample=False, max_new_tokens=4, assistant_model=assistant)   # warm-up
            verdicts, seconds, tokens, per_call = [], 0.0, 0, []
            for i, ids in enumerate(prompts):
                out, t = timed_generate(model, ids, assistant, args.max_new_tokens, repeats)
                got = out[0].tolist()
                verdicts.append(judge(model, plain_out[i], got, name, i, exact, args.tie_ulps))
                seconds += t
                tokens += len(got) - ids.shape[1]
                per_call.append(assistant.last_stats.tokens_per_target_call)
            failures += verdicts.count("mismatch")
            parity = f"{verdicts.count('same')}/{len(prompts)}" + (f" +{verdicts.count('tie')} tie" if "tie" in verdicts else "")
            rows.append((name, parity, tokens / seconds, sum(plain_time) / seconds, statistics.mean(per_call)))
        except Exception as exc:                                   # report and go on with the others
            failures += 1
            rows.append((name, f"ERROR {type(exc).__name__}: {str(exc)[:80]}", None, None, None))
        print(f"  {rows[-1][0]}: {rows[-1][1]}", flush=True)

    kw = compiled_kwargs(model) if timed else None
    if kw is not None:                                             # a second baseline, never a failure
        try:
            seconds, tokens, same = 0.0, 0, 0
            for i, ids in enumerate(prompts):
                model.generate(ids, do_sample=False, max_new_tokens=args.max_new_tokens, **kw)   # compiles (untimed)
                out, t = timed_generate(model, ids, None, args.max_new_tokens, repeats, **kw)
                same += judge(model, plain_out[i], out[0].tolist(), "compiled", i, exact, args.tie_ulps) != "mismatch"
                seconds += t
                tokens += out.shape[1] - ids.shape[1]
            rows.insert(1, ("plain compiled (static)", f"{same}/{len(prompts)}", tokens / seconds,
                            sum(plain_time) / seconds, 1.0))
        except Exception as exc:
            rows.insert(1, ("plain compiled (static)", f"skipped: {type(exc).__name__}: {str(exc)[:60]}", None, None, None))
    return rows, failures


def main(argv=None) -> int:
    args = parse_args(argv)
    import hf_cascade  # noqa: F401  (installs the generate() hook)

    print(f"torch {torch.__version__}, device {args.device}"
          + (f" ({torch.cuda.get_device_name(0)})" if args.device.startswith("cuda") else "")
          + f", dtype {args.dtype} (parity in fp32), target {args.model}", flush=True)
    drafters = load_drafters(args)
    print("drafters: " + (", ".join(f"{k}={getattr(args, k) or SHIPPED[k].name}" for k in drafters) or "none"))
    table = assistants(drafters)
    wanted = args.assistants.split(",") if args.assistants else list(table)
    unknown = [w for w in wanted if w not in table]
    if unknown:
        print(f"unknown assistants {unknown}; known: {list(table)}", file=sys.stderr)
        return 2

    failures, exact = 0, {}
    for dtype_name in dict.fromkeys(["fp32", args.dtype]):     # parity in fp32 first, then the speed dtype
        print(f"\n{dtype_name}:", flush=True)
        model, tok = load_target(args, dtype_name)
        device = model.get_input_embeddings().weight.device
        if device.type == "meta":
            device = torch.device(args.device)
        prompts = [tok(p, return_tensors="pt").input_ids.to(device) for p in PROMPTS[: args.prompts]]
        timed = dtype_name == args.dtype
        rows, failed = run_assistants(model, prompts, table, wanted, drafters, args, exact=dtype_name == "fp32",
                                      timed=timed)
        failures += failed
        if not timed:
            exact = {row[0]: row[1] for row in rows}
        del model                                                   # before the next dtype's copy is loaded
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    print()
    print(f"{'assistant':<26} " + (f"{'fp32 parity':<14} " if exact else "") + f"{args.dtype + ' parity':<16} "
          f"{'tokens/s':>9} {'speedup':>8} {'tokens/call':>12}")
    for name, parity, tps, speedup, per_call in rows:
        num = (lambda v, f: format(v, f) if v is not None else "-")
        print(f"{name:<26} " + (f"{exact.get(name, '-'):<14} " if exact else "") + f"{parity:<16} "
              f"{num(tps, '9.1f'):>9} {num(speedup, '7.2f') + 'x' if speedup else '-':>8} {num(per_call, '12.2f'):>12}")
    print(f"\n{args.prompts} prompts x {args.max_new_tokens} new tokens, greedy, {args.device}; parity in fp32, speed in "
          f"{args.dtype}; " + ("all outputs identical to plain generate (or ties)" if not failures
                               else f"{failures} FAILURE(S)"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
