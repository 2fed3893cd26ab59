"""GLIDE training (hf_cascade.training.run_glide / .glide): a short train_glide run on a tiny target and a
tiny distillation store, saved in Hub layout with a model card, reloaded with identical logits and used by
GlideAssistant; the paper's no-cross-attention baseline (Figure 4) trained the same way; the per-record
target K/V memo."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from hf_cascade import GlideSettings
from hf_cascade.glide import GlideAssistant
from hf_cascade.loading import load_head
from hf_cascade.training import DistillStore
from hf_cascade.training.glide import TargetKVMemo, glide_acceptance, target_kv_batch
from hf_cascade.training.loop import TrainConfig, make_batch, split_records
from hf_cascade.training.run_glide import GLIDE_PRESETS, GlideSpec, build_glide, train_glide
from tests.test_training import distilled, target  # noqa: F401  (fixtures: tiny Llama target + its store)
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

SPEC = GlideSpec(
    hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=8, draft_vocab_size=64
)
COMMAND = "hf-cascade train glide --data tiny-distill --steps 8"


def _run(distilled, target, tmp_path_factory, cross_attention):
    store_path = distilled[2].out
    out = tmp_path_factory.mktemp("glide") / ("glide" if cross_attention else "baseline")
    cfg = TrainConfig(out, steps=8, batch_size=3, eval_every=4, eval_records=2, max_len=64, lr=3e-2, warmup=1)
    torch.manual_seed(0)
    model, state = train_glide(
        target,
        store_path,
        cfg,
        SPEC,
        target_name="tiny",
        command=COMMAND,
        progress=False,
        cross_attention=cross_attention,
    )
    return out, model, state


@pytest.fixture(scope="module")
def trained(distilled, target, tmp_path_factory):
    return _run(distilled, target, tmp_path_factory, True)


@pytest.fixture(scope="module")
def baseline(distilled, target, tmp_path_factory):
    return _run(distilled, target, tmp_path_factory, False)


def test_train_glide_learns_and_saves_hub_layout(trained, distilled):
    out, model, state = trained
    losses = [h["loss"] for h in state.history if "loss" in h]
    evals = [h for h in state.history if "eval" in h]
    assert len(losses) == 8 and [h["step"] for h in evals] == [4, 8]
    assert all(np.isfinite(losses)) and np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3]), losses
    assert {"alpha", "tau@5", "eval_tokens", "drafts"} <= set(evals[-1]["eval"])
    assert evals[-1]["eval"]["eval_tokens"] > 0
    files = set(os.listdir(out))
    assert {
        "model.safetensors",
        "config.json",
        "README.md",
        "modeling_glide.py",
        "configuration_glide.py",
        "attention_glide.py",
        "trainer_state.json",
    } <= files  # split module copied too
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_glide.GlideForCausalLM"
    assert config["cross_attention"] is True and config["draft_vocab_size"] == 64 and config["block_size"] == 5
    assert config["target_layer_ids"] == [1]  # l = N_T - N_D + m
    card = (out / "README.md").read_text()
    assert COMMAND in card and "## Measured acceptance" in card and "| before training |" in card
    assert "GLIDE draft model" in card and "cross-attends" in card
    ts = json.loads((out / "trainer_state.json").read_text())
    store = distilled[3]
    total = sum(len(store.sequence(i)[0]) for i in range(len(store)))
    # every record's target K/V were computed once and reused afterwards (8 steps x 3 sequences + evals)
    assert 0 < ts["target_kv"]["target_tokens"] <= total and ts["cross_attention"] is True
    assert ts["target_kv"]["cached_records"] <= len(store)


def test_reload_identical_logits_and_generate(trained, target):
    out, model, _ = trained
    reloaded = load_head(out).eval()
    x = ids(1, 5, 9, 13, 40, 41, 2, 95)
    with torch.no_grad():
        kv = model.target_kv(target(x[:, :5], use_cache=True).past_key_values)
        assert torch.equal(reloaded(x, target_key_values=kv).logits, model.eval()(x, target_key_values=kv).logits)
    for cape in (True, False):
        a = GlideAssistant(out, settings=GlideSettings(cape=cape), cpu_kernels=False)
        for prompt in (ids(1, 5, 9), ids(1, 50, 51, 52, 53, 54)):
            expected = target.generate(prompt, do_sample=False, max_new_tokens=16)
            got = target.generate(prompt, do_sample=False, max_new_tokens=16, assistant_model=a)
            assert got.tolist() == expected.tolist()
            assert a.last_stats.draft_forwards > 0


def test_baseline_without_cross_attention(baseline, trained, target):
    out, model, state = baseline
    assert model.config.cross_attention is False
    assert not any("cross_attn" in name for name, _ in model.named_parameters())
    assert sum(p.numel() for p in model.parameters()) < sum(p.numel() for p in trained[1].parameters())
    ts = json.loads((out / "trainer_state.json").read_text())
    assert ts["cross_attention"] is False and ts["target_kv"]["target_tokens"] == 0  # never runs the target
    losses = [h["loss"] for h in state.history if "loss" in h]
    assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3])
    # same metric, same held-out records: the two runs compare directly
    assert set(state.best) == set(trained[2].best) and {"alpha", "tau@5"} <= set(state.best)
    assert "without cross-attention" in (out / "README.md").read_text()
    reloaded = load_head(out)
    assert reloaded.config.cross_attention is False
    a = GlideAssistant(reloaded, cpu_kernels=False)
    prompt = ids(1, 5, 9)
    expected = target.generate(prompt, do_sample=False, max_new_tokens=16)
    assert target.generate(prompt, do_sample=False, max_new_tokens=16, assistant_model=a).tolist() == expected.tolist()


def test_target_kv_memo_and_acceptance_against_stored_tokens(distilled, target):
    store = DistillStore.open(distilled[2].out)
    torch.manual_seed(0)
    model, _ = build_glide(target, store, SPEC, "tiny")
    memo = TargetKVMemo(model, target)
    batch = make_batch(store, [0, 3, 5], 64, prompt_weight=0.1)
    direct = target_kv_batch(model, target, batch)
    first = memo(batch)
    tokens = memo.target_tokens
    assert tokens == int(batch.attention_mask.sum()) and len(memo.records) == 3
    valid = batch.attention_mask.bool()[:, None, :, None]
    for (k, v), (k2, v2) in zip(direct, first):
        torch.testing.assert_close(k2, k * valid)  # zeros at padding
        torch.testing.assert_close(v2, v * valid)
    again = memo(make_batch(store, [5, 0], 64, prompt_weight=0.1))  # cached: no target forward
    assert memo.target_tokens == tokens and again[0][0].shape[0] == 2
    torch.testing.assert_close(again[0][0][1], first[0][0][0, :, : again[0][0].shape[2]])
    small = TargetKVMemo(model, target, max_bytes=0)  # nothing kept, same values
    torch.testing.assert_close(small(batch)[0][0], first[0][0])
    assert len(small.records) == 0

    # acceptance against the stored tokens = the draft's argmax vs the next stored token on response positions
    _, held = split_records(store, 2)
    acc = glide_acceptance(model, target, store, held, max_len=64, kv_fn=memo)
    b = make_batch(store, held, 64, prompt_weight=0.0)
    with torch.no_grad():
        from hf_cascade.heads.glide import glide_cross_mask

        t = b.input_ids.shape[1]
        logits = model(
            b.input_ids,
            attention_mask=b.attention_mask,
            target_key_values=target_kv_batch(model, target, b),
            cross_attention_mask=glide_cross_mask(t, t, 5),
            full_vocab=False,
        ).logits
    hit = model.vocab_subset[logits[:, :-1].argmax(-1)] == b.input_ids[:, 1:]
    use = b.weights[:, 1:] > 0
    assert acc["eval_tokens"] == int(use.sum()) > 0
    assert acc["alpha"] == pytest.approx(float(hit[use].float().mean()))


def test_presets_fit_25_mb_for_gemma_geometry():
    """The presets' float32 size for Gemma-3-270M's geometry (640 hidden, 4 heads x 256, 1 K/V head, 18
    layers, 262144 tokens), counted on a meta-device model."""
    from transformers import Gemma3TextConfig

    from hf_cascade import GlideConfig, GlideForCausalLM

    gemma = Gemma3TextConfig(
        vocab_size=262144,
        hidden_size=640,
        intermediate_size=2048,
        num_hidden_layers=18,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        query_pre_attn_scalar=256,
    )
    for name, spec in GLIDE_PRESETS.items():
        for cross in (True, False):
            sizes = {k: v for k, v in vars(spec).items() if k not in ("first_block", "target_layer_ids")}
            config = GlideConfig.from_target(gemma, **sizes, cross_attention=cross)
            assert config.target_layer_ids == [17] and config.cross_attention_scale == 256**-0.5
            with torch.device("meta"):
                model = GlideForCausalLM(config)
            size = sum(p.numel() * 4 for p in model.parameters()) + 8 * spec.draft_vocab_size
            assert size <= 25e6, (name, cross, size / 1e6)
