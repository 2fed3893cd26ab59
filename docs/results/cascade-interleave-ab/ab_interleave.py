"""A/B: Max-Gram alone, Max-Gram with corpus n-grams, the cascade [drafter-xs v2, Max-Gram + corpus] with
``maxgram_first`` and with ``interleave`` (both ``cost_aware``), interleaved prompt by prompt.

usage: python ab_interleave.py TAKE [ARM,ARM,...]   Spec-Bench prompts FIRST .. FIRST+TAKE-1 of each category
(environment variable FIRST, default 3: none of the benchmark's first 3). Arms: maxgram, mg+corpus, cs+corpus
(maxgram_first), il+corpus (interleave), il (interleave without corpus). K matrix [[3, 10], [0, 10]] for the
cascades unless KROW0 is set (e.g. KROW0=4,10). Interleaving: hf_cascade.bench.runner.compare_assistants;
paired ratios as in `hf-cascade bench` (hf_cascade.bench.summary.paired)."""
import os, sys
import numpy as np, torch
from hf_cascade import CascadeAssistant, MaxGram, CorpusNGrams
from hf_cascade.bench import summary
from hf_cascade.bench.loading import load_model, load_drafts, load_prompts
from hf_cascade.bench.runner import compare_assistants


def setup(take: int, first: int, row0: list[int]):
    """The target, its tokenizer, Spec-Bench prompts ``first .. first + take - 1`` of each category, and the
    arms' assistant factories (shared with per_call.py)."""
    model, tok = load_model(None)
    drafter = load_drafts(["model_cards/gemma-3-270m-drafter-xs"], model)[0]
    corpus = CorpusNGrams.load("model_cards/gemma-3-270m-corpus-ngrams/corpus.safetensors")
    bycat = {}
    for it in load_prompts(None, first + take):
        bycat.setdefault(it["category"], []).append(it)
    prompts = [it for v in bycat.values() for it in v[first:first + take]]
    kw = dict(k_matrix=[row0, [0, 10]], cost_aware=True)
    make = {"maxgram": lambda: CascadeAssistant([MaxGram()]),
            "mg+corpus": lambda: CascadeAssistant([MaxGram(corpus=corpus)]),
            "cs+corpus": lambda: CascadeAssistant([drafter, MaxGram(corpus=corpus)], maxgram_first=True, **kw),
            "il+corpus": lambda: CascadeAssistant([drafter, MaxGram(corpus=corpus)], interleave=True, **kw),
            "il": lambda: CascadeAssistant([drafter, MaxGram()], interleave=True, **kw)}
    return model, tok, prompts, make


def main() -> None:
    take = int(sys.argv[1])
    arms = sys.argv[2].split(",") if len(sys.argv) > 2 else ["maxgram", "mg+corpus", "cs+corpus", "il+corpus"]
    row0 = [int(x) for x in os.environ.get("KROW0", "3,10").split(",")]
    model, tok, prompts, make = setup(take, int(os.environ.get("FIRST", 3)), row0)
    assistants = {n: make[n]() for n in arms}
    records, same = compare_assistants(model, tok, prompts, assistants)
    for r in records:
        print(r["prompt_index"], r["category"], r["method"], round(r["seconds"], 2), round(r["tokens_per_call"], 2))
    print("identical across arms:", same, "/", len(prompts))
    print("total s", {n: round(sum(r["seconds"] for r in records if r["method"] == n), 1) for n in arms})
    print("tok/call", {n: round(float(np.mean([r["tokens_per_call"] for r in records if r["method"] == n])), 2) for n in arms})
    for n, a in assistants.items():                     # the last prompt's drafting levels
        st = a.last_stats
        print(n, "levels", [(lv.name, lv.tokens_proposed, lv.tokens_accepted) for lv in getattr(st, "levels", [])])
    for i in range(len(arms)):
        for j in range(i + 1, len(arms)):
            p = summary.paired(records, arms[i], arms[j])
            print(f"{arms[i]}/{arms[j]}", round(p["ratio"], 3), round(p["low"], 3), round(p["high"], 3), p["faster_on"])


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
