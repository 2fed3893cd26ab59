"""The drafters and heads shipped in ``model_cards/`` for Gemma-3-270M (vanilla drafters, GLIDE, ReDrafter):
size limits, remote-code loading offline in a fresh interpreter with identical logits, and greedy parity
with the real target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hf_cascade import (CascadeAssistant, CascadeSettings, DynamicWindowAssistant, GlideAssistant, GlideSettings,
                        MaxGram,
                        ReDrafterAssistant, ReDrafterSettings)
from hf_cascade.heads.hub import load_head
from tests.fresh_process import run_offline
from tests.test_verify_linear import threads

CARDS = Path(__file__).resolve().parent.parent / "model_cards"
SHIPPED = ["gemma-3-270m-drafter-xs", "gemma-3-270m-drafter-m"]
#: tree-strategy heads: name -> (model_type, training command in the card)
TREE_HEADS = {"gemma-3-270m-glide-xs": ("hf_cascade_glide", "hf-cascade train glide"),
              "gemma-3-270m-redrafter-xs": ("hf_cascade_redrafter", "hf-cascade train redrafter")}


@pytest.mark.parametrize("name", SHIPPED)
def test_layout_and_size(name):
    d = CARDS / name
    assert (d / "model.safetensors").stat().st_size <= 25 * 1024 * 1024
    config = json.loads((d / "config.json").read_text())
    assert config["model_type"] == "hf_cascade_drafter" and config["vocab_size"] == 262144
    assert "AutoModelForCausalLM" in config["auto_map"]
    card = (d / "README.md").read_text()
    assert "hf-cascade train vanilla" in card and "alpha" in card


@pytest.mark.parametrize("name", list(TREE_HEADS))
def test_tree_head_layout_and_size(name):
    d = CARDS / name
    model_type, command = TREE_HEADS[name]
    assert (d / "model.safetensors").stat().st_size <= 25 * 1024 * 1024
    config = json.loads((d / "config.json").read_text())
    assert config["model_type"] == model_type and config["vocab_size"] == 262144
    assert "AutoModelForCausalLM" in config["auto_map"]
    card = (d / "README.md").read_text()
    assert command in card and "alpha" in card


def _tree_head_inputs(name: str) -> dict:
    """Inputs of one forward of a shipped tree head (random stand-ins for what the target provides)."""
    g = torch.Generator().manual_seed(0)
    if "glide" in name:       # target K/V of layer 11: [1, 1 kv head, 7 positions, 256]
        kv = [(torch.randn(1, 1, 7, 256, generator=g), torch.randn(1, 1, 7, 256, generator=g))]
        return {"input_ids": torch.tensor([[2, 9259, 236787, 108, 818, 5279, 529, 7001]]), "target_key_values": kv}
    return {"hidden_states": torch.randn(1, 640, generator=g), "inputs_embeds": torch.randn(1, 3, 640, generator=g)}


@pytest.mark.parametrize("name", list(TREE_HEADS))
def test_tree_head_reloads_offline_in_fresh_interpreter(name, tmp_path):
    d = CARDS / name
    model = load_head(d).eval()
    inputs = _tree_head_inputs(name)
    with threads(1), torch.no_grad():     # as the fresh interpreter (OMP_NUM_THREADS=1): see the test below
        torch.save({"inputs": inputs, "logits": model(**inputs).logits}, tmp_path / "expected.pt")
    script = f"""
import sys, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained({str(d)!r}, trust_remote_code=True).eval()
assert not any(k.startswith("hf_cascade") for k in sys.modules), "hf_cascade was imported"
e = torch.load({str(tmp_path / "expected.pt")!r})
with torch.no_grad():
    assert torch.equal(m(**e["inputs"]).logits, e["logits"])
print("OK")
"""
    assert run_offline(script, tmp_path).split() == ["OK"]


@pytest.mark.parametrize("name", SHIPPED)
def test_reload_offline_in_fresh_interpreter(name, tmp_path):
    d = CARDS / name
    model = load_head(d).eval()
    x = torch.tensor([[2, 9259, 236787, 108, 818, 5279, 529, 7001]])
    # as the fresh interpreter (OMP_NUM_THREADS=1): some BLAS kernels accumulate in another order with 2 threads
    # (seen on an AVX-512 CPU, and with MKL held to AVX2)
    with threads(1), torch.no_grad():
        torch.save({"x": x, "logits": model(x).logits}, tmp_path / "expected.pt")
    script = f"""
import sys, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained({str(d)!r}, trust_remote_code=True).eval()
assert not any(k.startswith("hf_cascade") for k in sys.modules), "hf_cascade was imported"
e = torch.load({str(tmp_path / "expected.pt")!r})
with torch.no_grad():
    assert torch.equal(m(e["x"]).logits, e["logits"])
print("OK")
"""
    assert run_offline(script, tmp_path).split() == ["OK"]


@pytest.mark.real_model
def test_greedy_parity_with_gemma(gemma):
    model, tok = gemma
    xs, m = (load_head(CARDS / n).eval() for n in SHIPPED)
    ids = tok("Question: Write a short poem about the sea.\n\nAnswer:", return_tensors="pt").input_ids
    plain = model.generate(ids, do_sample=False, max_new_tokens=24)
    for assistant in (
        CascadeAssistant([xs, MaxGram()], settings=CascadeSettings(min_confidence=0.4)),
        CascadeAssistant([m, xs, MaxGram()]),
        DynamicWindowAssistant(xs, verifier_model=m),
    ):
        out = model.generate(ids, do_sample=False, max_new_tokens=24, assistant_model=assistant)
        assert out.tolist() == plain.tolist(), repr(assistant)
        assert assistant.last_stats.target_calls < 24


@pytest.mark.real_model
def test_tree_heads_greedy_parity_with_gemma(gemma):
    model, tok = gemma
    ids = tok("Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
              "in May. How many clips did Natalia sell altogether in April and May?\n\nAnswer:", return_tensors="pt").input_ids
    plain = model.generate(ids, do_sample=False, max_new_tokens=24)
    glide = load_head(CARDS / "gemma-3-270m-glide-xs").eval()
    head = load_head(CARDS / "gemma-3-270m-redrafter-xs").eval()
    for assistant in (GlideAssistant(glide), GlideAssistant(glide, settings=GlideSettings.chain()),
                      ReDrafterAssistant(head, settings=ReDrafterSettings(beam_width=4, beam_length=5))):
        out = model.generate(ids, do_sample=False, max_new_tokens=24, assistant_model=assistant)
        assert out.tolist() == plain.tolist(), repr(assistant)
        stats = assistant.last_stats
        assert stats.target_calls < 24                       # the trained heads get tokens accepted on GSM8K-like text
        if max(stats.tree_leaves) > 1:                       # branching trees: Gemma's head runs on the walked rows only
            assert sum(stats.head_rows) < sum(n + 1 for n in stats.tree_sizes)
