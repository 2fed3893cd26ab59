"""The GLIDE draft head (hf_cascade.heads.glide, Du et al. ICML 2024): the block-wise cross mask, shapes with a
grouped-query target, decoding masks and caches, Hub round trip as remote code, strict loading, the
converter from the authors' checkpoint layout, and the training loss."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

import hf_cascade  # noqa: F401  (registers the heads)
from hf_cascade import GlideConfig, GlideForCausalLM
from hf_cascade.heads.glide import glide_cross_mask
from hf_cascade.heads.glide.convert import convert_reference_checkpoint
from hf_cascade.heads.hub import save_hub
from hf_cascade.loading import load_head
from hf_cascade.training.glide import glide_acceptance, glide_loss
from hf_cascade.training.loop import Batch
from tests import tiny_models as tm
from tests.fresh_process import run_offline
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

EVEN = torch.arange(0, tm.VOCAB, 2)


@pytest.fixture(scope="module")
def target():
    """Tiny Llama target with GQA: 4 query heads of size 8, 2 kv heads, 3 layers."""
    return tm.llama(layers=3, seed=0, block_scale=0.3)


def make_glide(target, seed: int = 0, **kw) -> GlideForCausalLM:
    torch.manual_seed(seed)
    args = dict(
        hidden_size=24,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        draft_vocab_size=len(EVEN),
        initializer_range=0.3,
        target_name_or_path="tiny/llama",
    )
    args.update(kw)
    model = GlideForCausalLM(GlideConfig.from_target(target, **args))
    if not model.config.share_target_embeddings and model.config.draft_vocab_size == len(EVEN):
        model.set_vocab_subset(EVEN)
    return tm._finish(model)


def target_cache(target, x):
    with torch.no_grad():
        return target(x, use_cache=True).past_key_values


def layer_kv(cache, layer):
    return (cache.layers[layer].keys, cache.layers[layer].values)


# -- the block-wise cross mask (Section 4.1) ----------------------------------------------------
def test_cross_mask_golden():
    # Row j = draft position, column k = target position; block length 5.
    expected = [
        "............",  # block 0 (positions 0-4) sees nothing
        "............",
        "............",
        "............",
        "............",
        "11111.......",  # block 1 (5-9) sees block 0
        "11111.......",
        "11111.......",
        "11111.......",
        "11111.......",
        "1111111111..",  # block 2 (10-11) sees blocks 0-1
        "1111111111..",
    ]
    golden = torch.tensor([[c == "1" for c in row] for row in expected])
    got = glide_cross_mask(12, 12, block=5)
    assert got.dtype == torch.bool and got.shape == (12, 12)
    assert torch.equal(got, golden)
    assert torch.equal(glide_cross_mask(7, 12, 5), golden[:7])
    causal = golden.clone()
    for j in range(5):
        causal[j, : j + 1] = True  # the authors' code: block 0 sees the target causally
    assert torch.equal(glide_cross_mask(12, 12, 5, first_block="causal"), causal)
    assert torch.equal(
        glide_cross_mask(4, 4, 2), torch.tensor([[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0]]).bool()
    )
    with pytest.raises(ValueError):
        glide_cross_mask(3, 3, 0)


# -- shapes, GQA, target layers -----------------------------------------------------------------
def test_shapes_with_gqa_target(target):
    g = make_glide(target)
    c = g.config
    assert (c.target_num_attention_heads, c.target_num_key_value_heads, c.target_head_dim) == (4, 2, 8)
    assert c.target_layer_ids == [1, 2]  # l = N_T - N_D + m
    assert c.cross_rope == [{"rope_type": "default", "rope_theta": 10000.0}] * 2
    layer = g.model.layers[0]
    assert layer.cross_attn.q_proj.weight.shape == (4 * 8, 24)  # h per-head W_j: d_D -> d_k
    assert layer.cross_attn.o_proj.weight.shape == (24, 4 * 8)  # W^O
    assert layer.self_attn.k_proj.weight.shape == (8, 24)  # draft GQA: 1 kv head of 8

    x = ids(1, 4, 6, 8, 10, 12, 14, 16)
    cache = target_cache(target, x)
    kv = g.target_kv(cache)
    assert len(kv) == 2 and kv[0][0] is cache.layers[1].keys and kv[1][1] is cache.layers[2].values
    assert kv[0][0].shape == (1, 2, 8, 8)  # [B, kv_heads, S, head_dim]
    out = g(x, target_key_values=kv)
    assert out.logits.shape == (1, 8, tm.VOCAB) and out.past_key_values is None
    assert g(x, target_key_values=kv, full_vocab=False).logits.shape == (1, 8, len(EVEN))
    assert torch.equal(g(x, target_key_values=cache).logits, out.logits)  # the whole cache: layers picked inside
    odd = torch.ones(tm.VOCAB, dtype=torch.bool)
    odd[EVEN] = False
    assert (out.logits[..., odd] == torch.finfo(out.logits.dtype).min).all()

    # GQA = each kv head serving 2 query heads: explicitly repeated K/V give the same result
    rep = [(k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)) for k, v in kv]
    torch.testing.assert_close(g(x, target_key_values=rep).logits, out.logits)
    # The glimpse matters: other K/V change the output, the target's layer 0 is not read
    other = target_cache(target, ids(1, 5, 7, 9, 11, 13, 15, 17))
    assert not torch.allclose(g(x, target_key_values=other).logits, out.logits)
    assert not torch.allclose(g(x).logits, out.logits)  # no target K/V: no cross-attention
    with pytest.raises(ValueError, match="do not fit"):
        g(x, target_key_values=[(k[..., :4], v[..., :4]) for k, v in kv])


def test_decode_mask_block_mask_and_cache(target):
    g = make_glide(target)
    x = ids(1, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24)  # T = 12
    # Decoding: the target verified 6 tokens; draft positions >= 6 see all of them, earlier ones k < i.
    kv6 = g.target_kv(target_cache(target, x[:, :6]))
    full = g(x, target_key_values=kv6, full_vocab=False).logits
    i, k = torch.arange(12)[:, None], torch.arange(6)[None, :]
    explicit = g(x, target_key_values=kv6, cross_attention_mask=k < i, full_vocab=False).logits
    assert torch.equal(full, explicit)
    assert (k < i)[6:].all()
    cache, steps = None, []
    for a, b in ((0, 5), (5, 6), (6, 9), (9, 12)):
        out = g(x[:, a:b], past_key_values=cache, use_cache=True, target_key_values=kv6, full_vocab=False)
        cache = out.past_key_values
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    cache.crop(-4)  # roll back to 8 tokens
    out = g(x[:, 8:], past_key_values=cache, target_key_values=kv6, full_vocab=False)
    torch.testing.assert_close(out.logits, full[:, 8:], rtol=1e-5, atol=1e-5)

    # Training: block-wise mask over the whole sequence's K/V.
    kv12 = g.target_kv(target_cache(target, x))
    train = g(x, target_key_values=kv12, cross_attention_mask=glide_cross_mask(12, 12), full_vocab=False).logits
    blind = g(x, full_vocab=False).logits  # block 0 sees nothing = no glimpse
    torch.testing.assert_close(train[:, :5], blind[:, :5])
    assert not torch.allclose(train[:, 5:], blind[:, 5:])
    # One layer: block 1 of training = decoding after the target verified 5 tokens (KV cache delay).
    g1 = make_glide(target, num_hidden_layers=1)
    kv12, kv5 = g1.target_kv(target_cache(target, x)), g1.target_kv(target_cache(target, x[:, :5]))
    train1 = g1(x, target_key_values=kv12, cross_attention_mask=glide_cross_mask(12, 12), full_vocab=False).logits
    torch.testing.assert_close(train1[:, 5:10], g1(x, target_key_values=kv5, full_vocab=False).logits[:, 5:10])


def test_labels_loss_and_left_padding(target):
    g = make_glide(target)
    x = ids(1, 4, 5, 6, 8, 10)
    kv = g.target_kv(target_cache(target, x))
    reduced = g(x, target_key_values=kv, full_vocab=False).logits[0].log_softmax(-1)
    labels = torch.tensor([[1, 4, 5, -100, 8, 10]])  # 5 odd: outside the subset
    expected = -(reduced[0, 2] + reduced[3, 4] + reduced[4, 5]) / 3  # 4 -> 2, 8 -> 4, 10 -> 5
    torch.testing.assert_close(g(x, target_key_values=kv, labels=labels).loss, expected)

    # Left padding: padded positions are masked in self- and cross-attention.
    a, b = ids(1, 4, 6, 8, 10), ids(1, 12, 14)
    batch = torch.cat([a, torch.cat([torch.full((1, 2), tm.PAD), b], 1)])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        tcache = target(batch, attention_mask=mask, position_ids=pos, use_cache=True).past_key_values
    cross = torch.ones(5, 5, dtype=torch.bool)
    out = g(batch, attention_mask=mask, position_ids=pos, target_key_values=tcache, cross_attention_mask=cross).logits
    single_b = g(
        b, target_key_values=target_cache(target, b), cross_attention_mask=torch.ones(3, 3, dtype=torch.bool)
    ).logits
    torch.testing.assert_close(out[1, -1], single_b[0, -1], rtol=1e-4, atol=1e-4)


def test_share_target_embeddings(target, tmp_path):
    g = make_glide(
        target,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        share_target_embeddings=True,
        draft_vocab_size=None,
    )
    assert g.config.draft_vocab_size == tm.VOCAB
    names = set(g.state_dict())
    assert not any("embed_tokens" in n or "lm_head" in n or "vocab_subset" in n for n in names)
    x = ids(1, 4, 6, 9)
    with pytest.raises(RuntimeError, match="tie_to_target"):
        g(x)
    g.tie_to_target(target)
    assert g.get_input_embeddings() is target.get_input_embeddings()
    assert not any(p is target.lm_head.weight for p in g.parameters())  # borrowed, not trained
    kv = g.target_kv(target_cache(target, x))
    logits = g(x, target_key_values=kv).logits
    assert logits.shape == (1, 4, tm.VOCAB)
    save_hub(g, tmp_path / "shared", "")
    m = load_head(tmp_path / "shared").tie_to_target(target)
    assert torch.equal(m(x, target_key_values=kv).logits, logits)
    with pytest.raises(ValueError, match="hidden_size"):
        make_glide(target, share_target_embeddings=True, draft_vocab_size=None).tie_to_target(target)


# -- Hub layout ---------------------------------------------------------------------------------
def test_save_hub_reload_as_remote_code_in_fresh_process(target, tmp_path):
    g = make_glide(target)
    repo = tmp_path / "repo"
    save_hub(g, repo, "# Tiny GLIDE\n\nFor tests.")
    files = set(os.listdir(repo))
    assert {"config.json", "model.safetensors", "README.md", "configuration_glide.py", "modeling_glide.py"} <= files
    config = json.loads((repo / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_glide.GlideForCausalLM"
    assert config["model_type"] == "hf_cascade_glide" and config["target_layer_ids"] == [1, 2]
    assert "base_model: tiny/llama" in (repo / "README.md").read_text()

    x = ids(1, 4, 5, 6, 7, 8, 10, 95)
    kv = g.target_kv(target_cache(target, x[:, :5]))
    mask = glide_cross_mask(8, 5, 2)
    torch.save(
        {
            "x": x,
            "kv": kv,
            "mask": mask,
            "logits": g(x, target_key_values=kv).logits,
            "masked": g(x, target_key_values=kv, cross_attention_mask=mask, full_vocab=False).logits,
        },
        tmp_path / "expected.pt",
    )
    script = f"""
import sys, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained({str(repo)!r}, trust_remote_code=True).eval()
assert not any(k.startswith("hf_cascade") for k in sys.modules), "hf_cascade was imported"
assert type(m).__module__.startswith("transformers_modules"), type(m).__module__
e = torch.load({str(tmp_path / "expected.pt")!r})
with torch.no_grad():
    assert torch.equal(m(e["x"], target_key_values=e["kv"]).logits, e["logits"])
    out = m(e["x"], target_key_values=e["kv"], cross_attention_mask=e["mask"], full_vocab=False)
    assert torch.equal(out.logits, e["masked"])
print("OK", m.num_parameters())
"""
    assert run_offline(script, tmp_path).split() == ["OK", str(g.num_parameters())]


def test_load_head_roundtrip_and_wrong_shape(target, tmp_path):
    g = make_glide(target)
    save_hub(g, tmp_path / "ok", "")
    m = load_head(tmp_path / "ok")
    x = ids(1, 4, 6, 9)
    kv = g.target_kv(target_cache(target, x))
    assert torch.equal(m(x, target_key_values=kv).logits, g(x, target_key_values=kv).logits)
    assert torch.equal(m.vocab_subset, EVEN)
    for key, value in (("hidden_size", 48), ("target_head_dim", 16)):
        save_hub(g, tmp_path / key, "")
        cfg = json.loads((tmp_path / key / "config.json").read_text())
        cfg[key] = value
        (tmp_path / key / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(ValueError, match="does not match its config"):
            load_head(tmp_path / key)


def test_config_roundtrip(tmp_path):
    c = GlideConfig(
        vocab_size=96,
        hidden_size=32,
        num_attention_heads=4,
        rope_theta=5000.0,
        rope_config={"rope_type": "linear", "factor": 2.0},
        target_num_attention_heads=4,
        target_head_dim=8,
        target_num_hidden_layers=3,
    )
    c.save_pretrained(tmp_path)
    c2 = GlideConfig.from_pretrained(tmp_path)
    assert c2.to_dict() == c.to_dict() and c2.rope_theta == 5000.0 and c2.rope_config["factor"] == 2.0
    assert c2.resolved_target_layers() == [2] and c2.draft_vocab_size == 96 and not c2.tie_word_embeddings
    with pytest.raises(ValueError):
        GlideConfig(num_hidden_layers=2, target_layer_ids=[3])


# -- converter from the authors' checkpoint layout ------------------------------------------------
REF_CONFIG = {
    "architectures": ["smallLlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": tm.VOCAB,
    "hidden_size": 24,
    "intermediate_size": 40,
    "num_hidden_layers": 1,
    "num_attention_heads": 3,
    "num_key_value_heads": 3,
    "hidden_act": "silu",
    "max_position_embeddings": 512,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "use_cache": True,
    "pad_token_id": None,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pretraining_tp": 1,
    "tie_word_embeddings": False,
    "block_size": 5,
    "large_hidden_size": 32,
    "large_head_dim": 8,
    "large_num_attention_heads": 4,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "use_remap": False,
    "torch_dtype": "float32",
    "transformers_version": "4.34.0",
}


def ref_weights(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = h // cfg["num_attention_heads"]
    kvd = cfg["num_key_value_heads"] * d
    lh = cfg["large_hidden_size"]
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for m in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{m}."
        shapes.update(
            {
                p + "self_attn.q_proj.weight": (h, h),
                p + "self_attn.k_proj.weight": (kvd, h),
                p + "self_attn.v_proj.weight": (kvd, h),
                p + "self_attn.o_proj.weight": (h, h),
                p + "cross_attn.q_proj.weight": (lh, h),
                p + "cross_attn.o_proj.weight": (h, lh),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
            }
        )
    return {
        k: (1 + 0.1 * torch.randn(s, generator=g)) if len(s) == 1 else 0.3 * torch.randn(s, generator=g)
        for k, s in shapes.items()
    }


def ref_forward(w: dict, cfg: dict, x: torch.Tensor, large_kv: list) -> torch.Tensor:
    """Direct computation of the reference ``smallLlamaForCausalLM`` in eval mode (no cross mask)."""

    def rms(t, weight):
        return weight * (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + cfg["rms_norm_eps"]))

    def rope(t, base):  # t [B, heads, T, d], positions 0..T-1
        d = t.shape[-1]
        inv = 1.0 / (base ** (torch.arange(0, d, 2).float() / d))
        f = torch.outer(torch.arange(t.shape[2]).float(), inv)
        emb = torch.cat([f, f], -1)
        rot = torch.cat([-t[..., d // 2 :], t[..., : d // 2]], -1)
        return t * emb.cos() + rot * emb.sin()

    def attention(q, k, v, causal):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
        return s.softmax(-1) @ v

    b, t = x.shape
    nh, lnh = cfg["num_attention_heads"], cfg["large_num_attention_heads"]
    d, ld = cfg["hidden_size"] // nh, cfg["large_hidden_size"] // lnh
    h = w["model.embed_tokens.weight"][x]
    for m in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{m}."
        a = rms(h, w[p + "input_layernorm.weight"])
        heads = lambda z, n, dd: z.view(b, t, n, dd).transpose(1, 2)  # noqa: E731
        q = rope(heads(a @ w[p + "self_attn.q_proj.weight"].T, nh, d), cfg["rope_theta"])
        k = rope(heads(a @ w[p + "self_attn.k_proj.weight"].T, cfg["num_key_value_heads"], d), cfg["rope_theta"])
        v = heads(a @ w[p + "self_attn.v_proj.weight"].T, cfg["num_key_value_heads"], d)
        h = h + attention(q, k, v, True).transpose(1, 2).reshape(b, t, -1) @ w[p + "self_attn.o_proj.weight"].T
        lk, lv = large_kv[len(large_kv) - cfg["num_hidden_layers"] + m]
        rep = lnh // lk.shape[1]
        cq = rope(heads(h @ w[p + "cross_attn.q_proj.weight"].T, lnh, ld), 10000.0)
        c = attention(cq, lk.repeat_interleave(rep, 1), lv.repeat_interleave(rep, 1), False)
        h = h + c.transpose(1, 2).reshape(b, t, -1) @ w[p + "cross_attn.o_proj.weight"].T
        a = rms(h, w[p + "post_attention_layernorm.weight"])
        mlp = torch.nn.functional.silu(a @ w[p + "mlp.gate_proj.weight"].T) * (a @ w[p + "mlp.up_proj.weight"].T)
        h = h + mlp @ w[p + "mlp.down_proj.weight"].T
    return rms(h, w["model.norm.weight"]) @ w["lm_head.weight"].T


def test_convert_reference_checkpoint(tmp_path):
    target = tm.llama(layers=2, seed=3)  # 4 heads of 8, 2 kv heads
    src = tmp_path / "glide-ref"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(REF_CONFIG))
    w = ref_weights(REF_CONFIG)
    torch.save(w, src / "pytorch_model.bin")
    out = tmp_path / "converted"
    model = convert_reference_checkpoint(src, out)
    c = model.config
    assert (c.target_num_attention_heads, c.target_head_dim, c.block_size, c.draft_vocab_size) == (4, 8, 5, tm.VOCAB)
    assert c.target_layer_ids is None and c.head_dim == 8

    x = ids(1, 4, 9, 33, 60, 7, 2, 95, 11)
    with torch.no_grad():
        cache = target(x, use_cache=True).past_key_values
    large_kv = [layer_kv(cache, l) for l in range(2)]
    expected = ref_forward(w, REF_CONFIG, x, large_kv)  # [1, T, V]
    everything = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool)  # the reference's eval: no cross mask
    got = model(x, target_key_values=cache, cross_attention_mask=everything).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    reloaded = load_head(out)
    assert torch.equal(reloaded(x, target_key_values=cache, cross_attention_mask=everything).logits, got)

    # JointModel prefix is accepted; a wrong shape is refused.
    (src / "pytorch_model.bin").unlink()
    torch.save({"small_model." + k: v for k, v in w.items()}, src / "pytorch_model.bin")
    convert_reference_checkpoint(src, tmp_path / "joint")
    bad = dict(w)
    bad["model.layers.0.cross_attn.q_proj.weight"] = torch.zeros(24, 24)
    torch.save(bad, src / "pytorch_model.bin")
    with pytest.raises(ValueError, match="wrong shape"):
        convert_reference_checkpoint(src, tmp_path / "bad")


# -- training -----------------------------------------------------------------------------------
def test_glide_loss_decreases_and_acceptance():
    target = tm.llama(layers=2, seed=1, block_scale=0.3)
    torch.manual_seed(0)
    g = GlideForCausalLM(
        GlideConfig.from_target(
            target,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            initializer_range=0.1,
        )
    )
    g.train()
    with torch.no_grad():  # the target's greedy continuations
        seqs = target.generate(
            torch.tensor([[1, 5], [1, 40]]), do_sample=False, max_new_tokens=18, eos_token_id=None, pad_token_id=0
        )
    weights = torch.ones(seqs.shape, dtype=torch.float)
    weights[:, :2] = 0.1
    weights[:, 0] = 0.0
    batch = Batch(seqs, weights, torch.ones_like(seqs), [0, 1])
    before = glide_acceptance(g, target, batch)
    assert set(before) == {"alpha", "eval_tokens", "tau@5", "drafts", "tau", *(f"accept@{k}" for k in range(1, 6))}
    assert before["drafts"] == 8 and before["tau"] == before["tau@5"]
    opt = torch.optim.AdamW(g.parameters(), lr=1e-2)
    losses = []
    for _ in range(12):
        loss, metrics = glide_loss(g, target, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0], losses
    assert all(p.grad is None for p in target.parameters())
    assert g.model.layers[0].cross_attn.q_proj.weight.grad.abs().sum() > 0
    after = glide_acceptance(g, target, batch)
    assert after["alpha"] > before["alpha"] and after["tau@5"] >= before["tau@5"]
    assert 0.0 <= after["alpha"] <= 1.0 and "top1" in metrics
