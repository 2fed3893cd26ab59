"""How many tokens per target call can a lookup draft reach on the bench's greedy outputs? (issue 28's bar:
Max-Gram at 1.3x SuffixDecoding's speed, both lookups verified in the same core.)

Replays each prompt's plain greedy output (from a bench's results.json, re-tokenized) step by step: a step
drafts up to D tokens from the context (prompt + output so far), accepts the longest prefix that matches the
true output, emits it plus one token. No cost model: every draft is verified in full (a ceiling).

  maxgram        Max-Gram's own choice: the continuation of the most recent occurrence of the longest suffix
                 (up to 8 tokens) that occurred before (hf_cascade.drafters.maxgram).
  maxgram+cache  the same, where an earlier prompt's text of the run (a cache of earlier responses, as
                 SuffixDecoding's global tree) holds a longer match than the context.
  oracle         hindsight: the best continuation among *all* earlier occurrences of the last token in the
                 context (any suffix length, any occurrence): the ceiling of any lookup tree built from it.
  oracle+cache   the same over the context and every earlier prompt's text.
Usage: oracle.py results.json [D ...]"""
import json, sys
from transformers import AutoTokenizer
import hf_cascade.models as m
from hf_cascade.drafters.maxgram import _suffix_match, follow
from hf_cascade.drafters.maxgram import common_prefix as lcp

res = json.load(open(sys.argv[1]))
depths = [int(x) for x in sys.argv[2:]] or [8, 16, 32]
tok = AutoTokenizer.from_pretrained(str(m.ensure_gemma3_270m()))
recs = sorted([r for r in res['records'] if r['method'] == 'plain'], key=lambda r: r['order'])
texts = [(tok(r['prompt'])['input_ids'], tok(r['output_text'], add_special_tokens=False)['input_ids'][:128]) for r in recs]

def draft_len(mode, ctx, truth, cache, D):
    if mode.startswith('maxgram'):
        mlen, end = _suffix_match(ctx, 8)
        best = (mlen, follow(ctx, end, D) if mlen >= 1 else None)
        if mode == 'maxgram+cache':
            for src in reversed(cache):                      # most recent text first; a longer match wins
                n, e = _suffix_match(src + ctx[-8:], 8)      # an occurrence inside src, continuing in src
                if n > best[0] and 0 <= e < len(src) - 1:
                    best = (n, src[e + 1:e + 1 + D])
        return lcp(best[1], truth) if best[1] else 0
    a, last = 0, ctx[-1]
    for src in [ctx] + (cache if mode == 'oracle+cache' else []):
        lim = len(src) - 1 if src is ctx else len(src)
        for j in range(lim):
            if src[j] == last:
                a = max(a, lcp(src[j + 1:j + 1 + D], truth))
    return a

modes = ['maxgram', 'maxgram+cache', 'oracle', 'oracle+cache']
print(f"{len(texts)} outputs, {sum(len(o) for _, o in texts)} tokens\n")
print("| draft depth D | " + " | ".join(modes) + " |")
print("|---:|" + "---:|" * len(modes))
for D in depths:
    row = []
    for mode in modes:
        toks = calls = 0
        for k, (p, o) in enumerate(texts):
            cache = [a + b for a, b in texts[:k]]
            i = 0
            while i < len(o):
                ctx = p + o[:i]
                a = min(draft_len(mode, ctx, o[i:i + D], cache, D), len(o) - i - 1)
                i += a + 1
                calls += 1
            toks += len(o)
        row.append(f"{toks / calls:.2f}")
    print(f"| {D} | " + " | ".join(row) + " |", flush=True)
