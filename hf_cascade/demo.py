"""``hf-cascade demo``: stream three answers of the default model with ``CascadeAssistant([MaxGram()])``,
then time plain ``generate`` against it on the same prompts (interleaved) and check the outputs match.

The default target, Gemma-3-270M, is a *base* model: the prompts are text to continue, not chat turns.
"""

from __future__ import annotations

import sys

DEMO_PROMPTS = [
    {
        "category": "code",
        "prompt": 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    },
    {
        "category": "rewrite",
        "prompt": "The planets of the solar system, in order from the Sun, are Mercury, Venus, Earth, Mars, "
        "Jupiter, Saturn, Uranus and Neptune.\nHere is one sentence about each planet:\n",
    },
    {
        "category": "explain",
        "prompt": "Question: What are the four stages of the water cycle?\nAnswer:",
    },
]


def _err(msg: str) -> None:
    print(f"[hf-cascade demo] {msg}", file=sys.stderr, flush=True)


def run_demo(max_new_tokens: int = 96) -> int:
    """Run the demo (prints to stdout); returns a process exit code."""
    import torch
    from transformers import TextStreamer

    from . import CascadeAssistant, MaxGram
    from .backends import wants_cpu_kernels
    from .bench import BenchConfig, run_benchmark
    from .models import load_default_target

    _err("loading Gemma-3-270M (first use assembles and converts it once; later loads take seconds)")
    model, tokenizer = load_default_target()
    if wants_cpu_kernels(model, None):  # a float32 target on CPU: the assistant will engage the CPU kernels
        from .backends.cpu import panel

        _err("preparing the CPU verification kernel (compiled once per machine, ~30 s the first time)")
        panel.extension()  # else the first generate() below would pause for the build
    assistant = CascadeAssistant([MaxGram()])

    print(
        f"=== Streaming {len(DEMO_PROMPTS)} answers with CascadeAssistant([MaxGram()]), greedy, "
        f"{max_new_tokens} new tokens ===\n"
    )
    for i, item in enumerate(DEMO_PROMPTS, 1):
        print(f"--- prompt {i} ---\n{item['prompt']}", end="", flush=True)
        ids = tokenizer(item["prompt"], return_tensors="pt")
        streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
        with torch.inference_mode():
            model.generate(
                **ids,
                assistant_model=assistant,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                streamer=streamer,
                pad_token_id=tokenizer.pad_token_id,
            )
        stats = assistant.last_stats
        print(
            f"\n[{stats.new_tokens} tokens in {stats.target_calls} target calls: "
            f"{stats.tokens_per_target_call:.2f} tokens per call]\n"
        )

    print("=== Timing plain generate vs CascadeAssistant([MaxGram()]) on the same prompts (interleaved) ===")
    config = BenchConfig(strategy="maxgram", baselines=["plain"], max_new_tokens=max_new_tokens)
    result = run_benchmark(config, model, tokenizer, DEMO_PROMPTS, progress=True)
    plain, ours = result.summary["overall"]["plain"], result.summary["overall"]["maxgram"]
    for rec in result.records:
        if rec["method"] == "maxgram":
            p = next(r for r in result.records if r["method"] == "plain" and r["prompt_index"] == rec["prompt_index"])
            print(
                f"  prompt {rec['prompt_index'] + 1}: plain {p['seconds']:.2f}s, ours {rec['seconds']:.2f}s "
                f"({p['seconds'] / rec['seconds']:.2f}x), identical: {rec['identical_to_plain']}"
            )
    print(f"plain generate : {plain['tokens_per_second']:.1f} tokens/s")
    print(
        f"hf_cascade     : {ours['tokens_per_second']:.1f} tokens/s, "
        f"{ours['tokens_per_target_call']:.2f} tokens per target call"
    )
    print(
        f"speedup        : {ours['speedup']:.2f}x (total time), "
        f"{ours['speedup_mean_per_prompt']:.2f}x (mean per prompt)"
    )
    print(f"identical outputs: {ours['identical']}/{ours['prompts']}")
    return 0
