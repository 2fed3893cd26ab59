"""Decoder forward at 2/4/8 rows with a 4D mask: transformers' sdpa (repeat_kv) vs GQA packed into the query rows."""
import time, torch, statistics
import torch.nn.functional as F
import hf_cascade
from transformers import DynamicCache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from hf_cascade.models import load_default_target
from hf_cascade.core.forward import verify_tree
from hf_cascade.core.structure import TokenTree
torch.set_num_threads(2)
orig = ALL_ATTENTION_FUNCTIONS["sdpa"]
CALLS = {"packed": 0, "fallback": 0}
def packed(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kw):
    B, H, q, D = query.shape
    CALLS["packed" if (q > 1 and H // key.shape[1] > 1 and attention_mask is not None) else "fallback"] += 1
    hkv = key.shape[1]
    rep = H // hkv
    if q == 1 or rep == 1 or attention_mask is None:
        return orig(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kw)
    q2 = query.reshape(B, hkv, rep * q, D)
    m = attention_mask[:, :, :, : key.shape[2]]
    m2 = m.repeat(1, 1, rep, 1) if m.shape[1] == 1 else None
    out = F.scaled_dot_product_attention(q2, key, value, attn_mask=m2, scale=scaling)
    return out.reshape(B, H, q, D).transpose(1, 2).contiguous(), None

model, tok = load_default_target()
dec = model.get_decoder()
ids = torch.randint(1000, 5000, (1, 800))
with hf_cascade.cpu_kernels(model), torch.no_grad():
    cache = DynamicCache()
    dec(input_ids=ids, past_key_values=cache, use_cache=True)
    for rows in (2, 4, 8, 4):
        tree = TokenTree(torch.randint(1000, 5000, (rows - 1,)), torch.tensor([-1] + [0] * (rows - 2)))
        ts = {"sdpa": [], "packed": []}; outs = {}
        for i in range(16):
            for name in (("sdpa", "packed") if i % 2 else ("packed", "sdpa")):
                ALL_ATTENTION_FUNCTIONS["sdpa"] = orig if name == "sdpa" else packed
                t = time.perf_counter()
                h = verify_tree(model, cache, 800, tree, 7, hidden_only=True)
                ts[name].append(time.perf_counter() - t)
                outs[name] = h
                cache.crop(-rows)
        ALL_ATTENTION_FUNCTIONS["sdpa"] = orig
        d = (outs["sdpa"] - outs["packed"]).abs().max().item()
        print(dict(CALLS)); CALLS.update(packed=0, fallback=0)
        print(rows, {k: round(1000 * statistics.median(v[4:]), 2) for k, v in ts.items()}, "maxdiff", d)
