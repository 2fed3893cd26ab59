"""The CPU verification head (hf_cascade/verify_head.py): same logits, restored afterwards, parity."""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

import hf_cascade
from hf_cascade.verify_head import fast_verification_head


class _Head(nn.Module):
    def __init__(self, vocab: int, dim: int, bias: bool):
        super().__init__()
        self.lm_head = nn.Linear(dim, vocab, bias=bias)

    def get_output_embeddings(self):
        return self.lm_head


def test_same_logits_and_restored():
    torch.manual_seed(0)
    for bias in (False, True):
        m = _Head(40000, 16, bias)
        x = torch.randn(1, 5, 16)
        ref = m.lm_head(x)
        with fast_verification_head(m) as applied:
            assert applied
            assert "forward" in vars(m.lm_head)
            out5, out1 = m.lm_head(x), m.lm_head(x[:, :1])
        assert "forward" not in vars(m.lm_head)
        torch.testing.assert_close(out5, ref, rtol=1e-5, atol=1e-5)
        assert torch.equal(out1, torch.nn.functional.linear(x[:, :1], m.lm_head.weight, m.lm_head.bias))


def test_not_applied_to_small_vocab_or_half_precision():
    with fast_verification_head(_Head(1000, 8, False)) as applied:
        assert not applied
    with fast_verification_head(_Head(40000, 8, False).to(torch.bfloat16)) as applied:
        assert not applied


def test_greedy_parity_with_large_vocab_target():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=40000, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, eos_token_id=None, bos_token_id=0)
    target = LlamaForCausalLM(cfg).eval()
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])
    ref = target.generate(ids, max_new_tokens=24, do_sample=False)
    for fast in (True, False):
        a = hf_cascade.CascadeAssistant([target, hf_cascade.MaxGram()], fast_head=fast)
        out = target.generate(ids, max_new_tokens=24, do_sample=False, assistant_model=a)
        assert torch.equal(out, ref)
        assert a.last_stats.tokens_per_target_call > 2
    assert "forward" not in vars(target.lm_head)
