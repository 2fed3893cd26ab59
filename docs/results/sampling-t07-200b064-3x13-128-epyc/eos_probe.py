"""Is HSDDW's first sampled token distributed as the target's? (prompt where the bench sampled EOS first)"""
import sys, collections, torch
import hf_cascade
from hf_cascade.bench.loading import load_model, load_prompts, load_drafts
from hf_cascade import DynamicWindowAssistant, CascadeAssistant, MaxGram

torch.set_num_threads(2)
model, tok = load_model(None)
prompts = load_prompts(None, 3)
qid = int(sys.argv[1]); n = int(sys.argv[2]); which = sys.argv[3]
p = next(x for x in prompts if x["question_id"] == qid)
ids = tok(p["prompt"], return_tensors="pt").input_ids
gc = model.generation_config
print("gen config: top_k", gc.top_k, "top_p", gc.top_p, "eos", gc.eos_token_id, "prompt tokens", ids.shape[1])
# the target's exact first-token distribution under temperature 0.7 and the config's top-k/top-p
with torch.no_grad():
    logits = model(ids).logits[0, -1].float()
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
procs = LogitsProcessorList([TemperatureLogitsWarper(0.7)] + ([TopKLogitsWarper(gc.top_k)] if gc.top_k else []) + ([TopPLogitsWarper(gc.top_p)] if gc.top_p and gc.top_p < 1 else []))
probs = procs(ids, logits[None])[0].softmax(-1)
eos = gc.eos_token_id if isinstance(gc.eos_token_id, list) else [gc.eos_token_id]
p_eos = float(probs[eos].sum())
top = probs.topk(5)
print("target p(first in eos)", round(p_eos, 4), "top5", [(tok.decode([int(i)]), round(float(v), 3)) for v, i in zip(top.values, top.indices)])
draft = load_drafts([hf_cascade.bench.loading.shipped_head("gemma-3-270m-drafter-xs")], model)[0]
counts = collections.Counter()
for s in range(n):
    torch.manual_seed(1000 + s)
    a = DynamicWindowAssistant(draft) if which == "hsddw" else (CascadeAssistant([MaxGram()]) if which == "maxgram" else None)
    kw = {"assistant_model": a} if a is not None else {}
    out = model.generate(ids, do_sample=True, temperature=0.7, max_new_tokens=2, **kw)
    counts[int(out[0, ids.shape[1]])] += 1
e = sum(counts[i] for i in eos)
import math
print(which, "n", n, "first token eos", e, "rate", e / n, "expected", round(p_eos * n, 1), "sd", round(math.sqrt(n * p_eos * (1 - p_eos)), 1))
print("top first tokens", [(tok.decode([i]), c) for i, c in counts.most_common(5)])
# chi-square over the target's top tokens (+ the rest pooled)
keys = [int(i) for i in probs.topk(6).indices]
exp = [float(probs[k]) * n for k in keys]; obs = [counts[k] for k in keys]
exp.append(n - sum(exp)); obs.append(n - sum(obs))
chi = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
print("chi2", round(chi, 2), "df", len(obs) - 1, "(5% critical at df 6: 12.59)", list(zip(obs, [round(e, 1) for e in exp])))
