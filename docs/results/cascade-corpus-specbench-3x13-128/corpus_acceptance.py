"""Teacher-forced acceptance of corpus n-gram drafts on the target's own Spec-Bench outputs (evaluation only).

usage: python corpus_acceptance.py BENCH_RESULTS.json CORPUS.safetensors
At every response position of the `plain` records (prompt + greedy output), Max-Gram's own suffix match is
classed by length (0, 1, 2, >= 3 tokens); where it is shorter than 3 (where MaxGram(corpus=...) consults the
corpus) the corpus's chain (up to 10 tokens, each with corpus frequency >= 0.3) is compared with what the target
said: first-token agreement and the accepted prefix length, per evidence bucket of the first token."""
import json, sys
from collections import defaultdict
from transformers import AutoTokenizer
from hf_cascade import CorpusNGrams
from hf_cascade.drafters.maxgram import longest_suffix_match
from hf_cascade.models import ensure_gemma3_270m
import torch

tok = AutoTokenizer.from_pretrained(ensure_gemma3_270m())
records = [r for r in json.load(open(sys.argv[1]))["records"] if r["method"] == "plain"]
corpus = CorpusNGrams.load(sys.argv[2])
own = defaultdict(lambda: [0, 0])                 # match class -> [positions, Max-Gram's first token right]
buckets = defaultdict(lambda: [0, 0, 0])          # bucket -> [drafts, first token right, accepted prefix tokens]
for r in records:
    prompt = tok(r["prompt"])["input_ids"]
    seq = prompt + tok(r["output_text"], add_special_tokens=False)["input_ids"]
    for i in range(len(prompt), len(seq)):
        m, end = longest_suffix_match(torch.tensor(seq[:i]), 10)
        cls = min(m, 3)
        own[cls][0] += 1
        own[cls][1] += m > 0 and seq[end + 1] == seq[i]
        if m >= 3:
            continue
        chain, first = corpus.chain(seq[:i], 10, 0.3)
        if first is None:
            continue
        n = 0
        while n < len(chain) and i + n < len(seq) and chain[n] == seq[i + n]:
            n += 1
        b = buckets[first.bucket]
        b[0] += 1; b[1] += n > 0; b[2] += n
total = sum(v[0] for v in own.values())
print(f"{len(records)} outputs, {total} response positions")
print("| Max-Gram's own match | positions | its first token right |")
print("|---|---:|---:|")
for cls in sorted(own):
    print(f"| {cls if cls < 3 else '>= 3'} tokens | {own[cls][0]} ({own[cls][0] / total:.0%}) | "
          f"{own[cls][1] / own[cls][0]:.2f} |")
print("\nwhere the match is shorter than 3 tokens:")
print("| corpus bucket (first token) | drafts | first token right | accepted tokens / draft |")
print("|---|---:|---:|---:|")
names = {20: ">= 3-token context, freq >= 0.8", 21: ">= 3-token context, freq 0.5-0.8", 22: ">= 3-token context, freq < 0.5",
         23: "1-2-token context, freq >= 0.8", 24: "1-2-token context, freq 0.5-0.8", 25: "1-2-token context, freq < 0.5"}
for b in sorted(buckets):
    d, f, n = buckets[b]
    print(f"| {b}: {names[b]} | {d} | {f / d:.2f} | {n / d:.2f} |")
