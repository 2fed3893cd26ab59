import time, torch
from hf_cascade.bench.loading import load_model, load_prompts
from hf_cascade.backends.cpu.argmax_screen import ArgmaxScreen
torch.set_num_threads(2)
model, tok = load_model(None)
W = model.lm_head.weight.detach()
xs = []
with torch.no_grad():
    for p in load_prompts(None, 1)[:4]:
        ids = tok(p["prompt"], return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=30, do_sample=False, output_hidden_states=True, return_dict_in_generate=True)
        xs += [h[-1][0, -1] for h in out.hidden_states[1:]]
X = torch.stack(xs).float().contiguous()
t = time.perf_counter(); fs = ArgmaxScreen(W, "float"); print("float build", round(time.perf_counter() - t, 2))
t = time.perf_counter(); vs = ArgmaxScreen(W, "integer"); print("integer build", round(time.perf_counter() - t, 2))
t = time.perf_counter(); auto = ArgmaxScreen(W); print("auto build", round(time.perf_counter() - t, 2), auto.product)
exact = torch.nn.functional.linear(X, W)
with torch.inference_mode():
    ya, term = vs.screen_logits(X)
    reach = X.norm(dim=1, keepdim=True) * vs.margin + term[:, None] * vs.copy_norm
    print("bound holds", bool(((exact - ya).abs() <= reach).all()), "max ratio", ((exact - ya).abs() / reach).max().item())
    print("argmax equal float", fs(X) == exact.argmax(1).tolist(), "integer", vs(X) == exact.argmax(1).tolist())
    print("cands per row float", fs.candidates / len(X), "integer", vs.candidates / len(X))
    top_f = vs.top(X, 50); print("top50 eq", torch.equal(top_f.topk(50).indices.sort().values, exact.topk(50).indices.sort().values))
def med(f, reps=9):
    ts = []
    for r in range(reps):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    ts.sort(); return round(ts[len(ts)//2] * 1e3, 2)
with torch.inference_mode():
    for m in (1, 2, 4, 8, 16):
        x = X[:m].contiguous()
        print(m, "float product", med(lambda: fs.screen_logits(x)), "integer product", med(lambda: vs.screen_logits(x)),
              "| screen float", med(lambda: fs(x)), "integer", med(lambda: vs(x)), "| head", med(lambda: torch.nn.functional.linear(x, W).argmax(-1)), flush=True)
