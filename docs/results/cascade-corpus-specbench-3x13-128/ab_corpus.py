"""A/B: Max-Gram alone, with corpus n-grams, and the cascade [drafter-xs v2, MaxGram] without / with them, interleaved.

usage: python ab_corpus.py TAKE CORPUS[,CORPUS2] [ARM,ARM,...]   Spec-Bench prompts FIRST .. FIRST+TAKE-1 of each
category (environment variable FIRST, default 3: none of the benchmark's first 3). Arms: maxgram, mg+corpus,
cascade, cs+corpus (the default four), mg+corpus2 (the second corpus file), mg+c-below2 / mg+c-below4
(corpus_below 2 / 4). Interleaving: hf_cascade.bench.runner.compare_assistants; paired ratios as in
`hf-cascade bench` (hf_cascade.bench.summary.paired)."""
import os, sys
import numpy as np, torch
torch.set_num_threads(2)
from hf_cascade import CascadeAssistant, MaxGram, CorpusNGrams
from hf_cascade.bench import summary
from hf_cascade.bench.loading import load_model, load_drafts, load_prompts
from hf_cascade.bench.runner import compare_assistants
take, paths = int(sys.argv[1]), sys.argv[2].split(",")
arms = sys.argv[3].split(",") if len(sys.argv) > 3 else ["maxgram", "mg+corpus", "cascade", "cs+corpus"]
first = int(os.environ.get("FIRST", 3))
model, tok = load_model(None)
drafter = load_drafts(["model_cards/gemma-3-270m-drafter-xs"], model)[0]
corpus, *more = [CorpusNGrams.load(p) for p in paths]
bycat = {}
for it in load_prompts(None, first + take):
    bycat.setdefault(it["category"], []).append(it)
prompts = [it for v in bycat.values() for it in v[first:first + take]]
kw = dict(k_matrix=[[3, 10], [0, 10]], maxgram_first=True, cost_aware=True)
make = {"maxgram": lambda: CascadeAssistant([MaxGram()]),
        "mg+corpus": lambda: CascadeAssistant([MaxGram(corpus=corpus)]),
        "cascade": lambda: CascadeAssistant([drafter, MaxGram()], **kw),
        "cs+corpus": lambda: CascadeAssistant([drafter, MaxGram(corpus=corpus)], **kw),
        "mg+corpus2": lambda: CascadeAssistant([MaxGram(corpus=more[0])]),
        "mg+c-below2": lambda: CascadeAssistant([MaxGram(corpus=corpus, corpus_below=2)]),
        "mg+c-below4": lambda: CascadeAssistant([MaxGram(corpus=corpus, corpus_below=4)])}
records, same = compare_assistants(model, tok, prompts, {n: make[n]() for n in arms})
for r in records:
    print(r["prompt_index"], r["category"], r["method"], round(r["seconds"], 2), round(r["tokens_per_call"], 2))
print("identical across arms:", same, "/", len(prompts))
print("total s", {n: round(sum(r["seconds"] for r in records if r["method"] == n), 1) for n in arms})
print("tok/call", {n: round(float(np.mean([r["tokens_per_call"] for r in records if r["method"] == n])), 2) for n in arms})
for i in range(len(arms)):
    for j in range(i + 1, len(arms)):
        p = summary.paired(records, arms[i], arms[j])
        print(f"{arms[i]}/{arms[j]}", round(p["ratio"], 3), round(p["low"], 3), round(p["high"], 3), p["faster_on"])
