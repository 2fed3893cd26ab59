"""The controlled experiment of GLIDE (Du et al., ICML 2024, Figure 4) on Gemma-3-270M, with the glimpse's
target layer as the variable: the same 1-layer draft (``GlideSpec()``, the ``xs`` preset) trained on the same
distillation data, same batches, same schedule and seed, without cross-attention (``base``) or cross-attending
to the target's cached K/V of layer 17 (the paper's ``l = N_T - N_D + m``) or 11 (both full-attention layers).
The target K/V of every record are computed once for all layers; everything else is hf_cascade's own training
code (``build_glide``, ``glide_loss``, ``glide_acceptance``, ``train``), i.e. what
``hf-cascade train glide [--no-cross-attention] [--target-layers L]`` runs.

    hf-cascade distill --out distill/gemma-train --batch-size 24 --limit 1176     # 43 min here
    python docs/results/glide-glimpse-layers-400/run.py distill/gemma-train 400 base,l11,l17

Writes ``results.json`` (per variant: ``[step, alpha, tau@5]`` every 100 steps) and ``acceptance_by_step.png``
next to this file; about 8 min for the target K/V plus 8-10 min per variant on 2 CPU threads.
"""
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from hf_cascade.bench.loading import load_model
from hf_cascade.heads.glide.modeling_glide import _cache_layers
from hf_cascade.training.glide import glide_acceptance, glide_loss
from hf_cascade.training.loop import Batch, TrainConfig, iterate_batches, make_batch, split_records, train
from hf_cascade.training.run_glide import GlideSpec, build_glide
from hf_cascade.training.store import DistillStore

HERE = Path(__file__).parent
NAMES = {"base": "no cross-attention (baseline)", "l17": "GLIDE, target layer 17 (paper: l = N_T - N_D)",
         "l11": "GLIDE, target layer 11", "l5": "GLIDE, target layer 5"}


def target_kv(target, store, layers, max_len):
    """record -> {layer: (k, v)}, each ``[kv_heads, n, d]``: the frozen target's cache over the record."""
    kv = {}
    with torch.no_grad():
        for s in range(0, len(store), 16):
            b = make_batch(store, list(range(s, min(s + 16, len(store)))), max_len, 0.1)
            out = target(input_ids=b.input_ids, attention_mask=b.attention_mask, use_cache=True, logits_to_keep=1)
            cache = _cache_layers(out.past_key_values)
            for r, (i, n) in enumerate(zip(b.index, b.attention_mask.sum(-1).tolist())):
                kv[i] = {l: (cache[l][0][r, :, :n].clone(), cache[l][1][r, :, :n].clone()) for l in layers}
    return kv


def batch_kv(kv, layer):
    """``Batch -> [(K, V)]`` with ``K``/``V`` ``[B, kv_heads, T, d]`` (zeros at padding), as TargetKVMemo returns."""
    def fn(batch: Batch):
        t = batch.input_ids.shape[1]
        k0 = kv[batch.index[0]][layer][0]
        k_all = k0.new_zeros(len(batch.index), k0.shape[0], t, k0.shape[-1])
        v_all = torch.zeros_like(k_all)
        for r, i in enumerate(batch.index):
            k, v = kv[i][layer]
            n = min(t, k.shape[-2])
            k_all[r, :, :n], v_all[r, :, :n] = k[:, :n], v[:, :n]
        return [(k_all, v_all)]
    return fn


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, r in results.items():
        steps = [e[0] for e in r["evals"]]
        axes[0].plot(steps, [e[1] for e in r["evals"]], "o-", label=NAMES.get(name, name))
        axes[1].plot(steps, [e[2] for e in r["evals"]], "o-", label=NAMES.get(name, name))
    axes[0].set_ylabel("held-out greedy acceptance alpha")
    axes[1].set_ylabel("tau@5 (tokens accepted of a 5-token draft)")
    for a in axes:
        a.set_xlabel("training step (batch 16 x 256 tokens)")
        a.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("GLIDE vs the same draft without cross-attention (Gemma-3-270M target, same data and steps)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(data: str, steps: int, variants: list[str]) -> None:
    torch.set_num_threads(2)
    store = DistillStore.open(data)
    target, _ = load_model(None)
    target.eval().requires_grad_(False)
    cfg = TrainConfig(HERE / "unused", steps=steps, eval_every=100, lr=2e-3)
    train_idx, eval_idx = split_records(store, cfg.eval_records)
    layers = sorted({int(v[1:]) for v in variants if v != "base"})
    kv = target_kv(target, store, layers, cfg.max_len)
    results = {}
    for var in variants:
        cross = var != "base"
        spec = dataclasses.replace(GlideSpec(), target_layer_ids=(int(var[1:]),) if cross else None)
        torch.manual_seed(0)
        model, _ = build_glide(target, store, spec, "gemma-3-270m", cross_attention=cross)
        fn = batch_kv(kv, int(var[1:])) if cross else (lambda b: None)
        t0 = time.time()
        state = train(model, iterate_batches(store, train_idx, cfg),
                      lambda m, b: glide_loss(m, target, b, spec.block_size, spec.first_block, kv=fn(b)),
                      lambda m: glide_acceptance(m, target, store, eval_idx, max_len=cfg.max_len, kv_fn=fn),
                      lambda m, s: None, cfg, progress=True)
        results[var] = {"evals": [(h["step"], round(h["eval"]["alpha"], 4), round(h["eval"]["tau@5"], 3))
                                  for h in state.history if "eval" in h],
                        "seconds": round(time.time() - t0), "params": sum(p.numel() for p in model.parameters())}
        (HERE / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, HERE / "acceptance_by_step.png")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","))
