import torch
from hf_cascade.bench.loading import load_model, load_prompts
torch.set_num_threads(2)
model, tok = load_model(None)
W = model.lm_head.weight.detach().double()
prompts = load_prompts(None, 1)
xs = []
with torch.no_grad():
    for p in prompts[:6]:
        ids = tok(p["prompt"], return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=40, do_sample=False, output_hidden_states=True, return_dict_in_generate=True)
        for h in out.hidden_states[1:]:
            xs.append(h[-1][0, -1])
X = torch.stack(xs).double()
print("rows", X.shape)
L = X @ W.T
def cands(Wq):
    c = (W - Wq).norm(dim=1)
    S = X @ Wq.T
    n = X.norm(dim=1, keepdim=True)
    lo = (S - n * c).max(dim=1, keepdim=True).values
    k = ((S + n * c) >= lo).sum(1).double()
    return k.mean().item(), k.median().item(), k.max().item()
def quant(bits, group):
    qmax = 2 ** (bits - 1) - 1
    Wg = W.view(W.shape[0], -1, group)
    a = Wg.abs().amax(-1, keepdim=True) / qmax
    return ((Wg / a).round().clamp(-qmax, qmax) * a).view_as(W)
for bits, group in ():
    print(bits, group, "cands mean/median/max", cands(quant(bits, group)))
Wq = quant(8, 640)
e = (W - Wq).norm(dim=1); nq = Wq.norm(dim=1)
b = X.abs().amax(1, keepdim=True) / 127
Xq = (X / b).round().clamp(-127, 127) * b
beta = (X - Xq).norm(dim=1, keepdim=True)
n = X.norm(dim=1, keepdim=True)
print("max|x|/||x||", (X.abs().amax(1) / X.norm(dim=1)).mean().item(), "beta/||x||", (beta / n).mean().item())
for name, reach in (("w only", n * e), ("x and w", n * e + beta * nq), ("x and w, nmax", n * e + beta * nq.max())):
    S = Xq @ Wq.T
    lo = (S - reach).max(dim=1, keepdim=True).values
    k = ((S + reach) >= lo).sum(1).double()
    print(name, k.mean().item(), k.median().item(), k.max().item())
for G in (128, 64, 32, 16):
    Xg = X.view(X.shape[0], -1, G)
    bg = Xg.abs().amax(-1, keepdim=True) / 127
    Xq = ((Xg / bg).round().clamp(-127, 127) * bg).view_as(X)
    beta = (X - Xq).norm(dim=1, keepdim=True)
    reach = n * e + beta * nq
    S = Xq @ Wq.T
    lo = (S - reach).max(dim=1, keepdim=True).values
    k = ((S + reach) >= lo).sum(1).double()
    print("group", G, "beta/||x||", (beta / n).mean().item(), k.mean().item(), k.median().item(), k.max().item())
