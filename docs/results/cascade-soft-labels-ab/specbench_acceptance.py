"""Teacher-forced greedy acceptance of drafters on the target's own Spec-Bench outputs (evaluation only).

usage: python specbench_acceptance.py BENCH_RESULTS.json DRAFTER_DIR [DRAFTER_DIR ...]
BENCH_RESULTS.json: an `hf-cascade bench` results file; its `plain` records (prompt + greedy output) are the
target's own text. Prints alpha (share of response tokens the drafter's argmax predicts), tau@8 and alpha per
category."""
import sys, json, numpy as np, torch
torch.set_num_threads(1)
from transformers import AutoModelForCausalLM, AutoTokenizer
from hf_cascade.training.vanilla import _run_lengths
from hf_cascade.models import ensure_gemma3_270m
tok = AutoTokenizer.from_pretrained(ensure_gemma3_270m())
d = json.load(open(sys.argv[1]))
recs = [r for r in d["records"] if r["method"] == "plain"]
for p in sys.argv[2:]:
    m = AutoModelForCausalLM.from_pretrained(p, trust_remote_code=True).eval()
    hits, cats = [], {}
    for r in recs:
        pi = tok(r["prompt"])["input_ids"]; ri = tok(r["output_text"], add_special_tokens=False)["input_ids"]
        ids = torch.tensor([pi + ri])
        with torch.no_grad():
            lg = m(input_ids=ids).logits[0]
        pred = lg[:-1].argmax(-1)
        ok = (pred == ids[0, 1:]).numpy()[len(pi) - 1:]
        hits.append(ok); cats.setdefault(r["category"], []).append(ok)
    flat = np.concatenate(hits)
    tau = np.concatenate([_run_lengths(h, 8) for h in hits]).mean()
    print(p, f"alpha={flat.mean():.3f} tau@8={tau:.3f}", " ".join(f"{c[:6]}={np.concatenate(v).mean():.2f}" for c, v in cats.items()))
