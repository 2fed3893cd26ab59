"""In-process A/B: the argmax screen's float vs integer product, Max-Gram, batches of B, greedy, 128 tokens."""
import sys, time, math, torch
from hf_cascade.bench.loading import load_model, load_prompts
from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.backends.cpu import argmax_screen as AS
torch.set_num_threads(2)
model, tok = load_model(None)
W = model.lm_head.weight
screens = {p: AS.ArgmaxScreen(W, p) for p in ("float", "integer")}
prompts = load_prompts(None, int(sys.argv[2]) if len(sys.argv) > 2 else 2)
tok.padding_side = "left"
B = int(sys.argv[1])
kw = dict(max_new_tokens=128, do_sample=False, pad_token_id=tok.pad_token_id)
res = {p: [] for p in screens}
enc = tok([p["prompt"] for p in prompts[:B]], return_tensors="pt", padding=True)
for p in screens:
    AS._SCREENS[id(W)] = (W._version, screens[p])
    model.generate(enc.input_ids, attention_mask=enc.attention_mask, assistant_model=CascadeAssistant([MaxGram()]), **dict(kw, max_new_tokens=16))
outs = {}
for j in range(0, len(prompts), B):
    enc = tok([p["prompt"] for p in prompts[j:j + B]], return_tensors="pt", padding=True)
    order = list(screens) if (j // B) % 2 == 0 else list(screens)[::-1]
    for p in order:
        AS._SCREENS[id(W)] = (W._version, screens[p])
        asst = CascadeAssistant([MaxGram()])
        t = time.perf_counter()
        out = model.generate(enc.input_ids, attention_mask=enc.attention_mask, assistant_model=asst, **kw)
        res[p].append(time.perf_counter() - t)
        outs.setdefault(j, out)
        assert torch.equal(outs[j], out), "outputs differ"
    print(j, {p: round(v[-1], 2) for p, v in res.items()}, flush=True)
r = [a / b for a, b in zip(res["float"], res["integer"])]
print("B", B, "total float %.1f integer %.1f" % (sum(res["float"]), sum(res["integer"])), "geomean float/integer %.3f" % math.exp(sum(map(math.log, r)) / len(r)),
      "candidates/row", {p: s.candidates for p, s in screens.items()})
