"""The drafters shipped in ``model_cards/`` for Gemma-3-270M: size limits, remote-code loading offline
in a fresh interpreter with identical logits, and greedy parity with the real target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hf_cascade import CascadeAssistant, DynamicWindowAssistant, MaxGram
from hf_cascade.heads.hub import load_head
from tests.fresh_process import run_offline

CARDS = Path(__file__).resolve().parent.parent / "model_cards"
SHIPPED = ["gemma-3-270m-drafter-xs", "gemma-3-270m-drafter-m"]


@pytest.mark.parametrize("name", SHIPPED)
def test_layout_and_size(name):
    d = CARDS / name
    assert (d / "model.safetensors").stat().st_size <= 25 * 1024 * 1024
    config = json.loads((d / "config.json").read_text())
    assert config["model_type"] == "hf_cascade_drafter" and config["vocab_size"] == 262144
    assert "AutoModelForCausalLM" in config["auto_map"]
    card = (d / "README.md").read_text()
    assert "hf-cascade train vanilla" in card and "alpha" in card


@pytest.mark.parametrize("name", SHIPPED)
def test_reload_offline_in_fresh_interpreter(name, tmp_path):
    d = CARDS / name
    model = load_head(d).eval()
    x = torch.tensor([[2, 9259, 236787, 108, 818, 5279, 529, 7001]])
    with torch.no_grad():
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
        CascadeAssistant([xs, MaxGram()], maxgram_first=True, min_confidence=0.4),
        CascadeAssistant([m, xs, MaxGram()]),
        DynamicWindowAssistant(xs, verifier_model=m),
    ):
        out = model.generate(ids, do_sample=False, max_new_tokens=24, assistant_model=assistant)
        assert out.tolist() == plain.tolist(), repr(assistant)
        assert assistant.last_stats.target_calls < 24
