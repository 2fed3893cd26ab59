"""The CPU verification head (hf_cascade/backends/cpu/verify_head.py): same logits with every kernel, restored
afterwards, parity (the block of rows per head call: tests/test_head_block.py)."""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

import hf_cascade
from hf_cascade import MaxGram, Policy
from hf_cascade.backends.cpu.kernels import KernelTuner
from hf_cascade.backends.cpu.verify_head import VerificationHead, fast_verification_head
from tests import tiny_models
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)


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
        torch.testing.assert_close(out1, ref[:, :1], rtol=1e-5, atol=1e-5)


def test_not_applied_to_small_vocab_or_half_precision():
    with fast_verification_head(_Head(1000, 8, False)) as applied:
        assert not applied
    with fast_verification_head(_Head(40000, 8, False).to(torch.bfloat16)) as applied:
        assert not applied


def test_greedy_parity_with_large_vocab_target():
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=40000,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=None,
        bos_token_id=0,
    )
    target = LlamaForCausalLM(cfg).eval()
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])
    ref = target.generate(ids, max_new_tokens=24, do_sample=False)
    for fast in (True, False):
        a = hf_cascade.CascadeAssistant(
            [target, hf_cascade.MaxGram()], policy=Policy(cost_aware=False), cpu_kernels=fast
        )
        out = target.generate(ids, max_new_tokens=24, do_sample=False, assistant_model=a)
        assert torch.equal(out, ref)
        assert a.last_stats.tokens_per_target_call > 2
    assert "forward" not in vars(target.lm_head)


def test_every_kernel_gives_the_head_rows(copy_kernel):
    """``linear`` is the model's own kernel (bit-equal); ``pad2`` (one row as a 2-row product), ``rows``
    (``W @ h.T``) and the copy kernel (``panel``, or oneDNN's ``packed``) the same products in another
    order, on 1 and 2 threads."""
    head = nn.Linear(16, 40000)
    before = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            for force in ("linear", "pad2", "rows", copy_kernel):
                vh = VerificationHead(head, tuner=KernelTuner(force=force))
                for x in (torch.randn(1, 1, 16), torch.randn(1, 3, 16), torch.randn(1, 9, 16)):
                    out, ref = vh(x), torch.nn.functional.linear(x, head.weight, head.bias)
                    assert out.shape == ref.shape
                    if force == "linear":
                        assert torch.equal(out, ref)
                    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
                assert force in ("pad2", "rows") or set(vh.tuner.choices().values()) <= {force}
        torch.set_num_threads(2)
        vh = VerificationHead(head, tuner=KernelTuner())  # tuned: explores, then chooses
        for _ in range(12):
            torch.testing.assert_close(
                vh(x), torch.nn.functional.linear(x, head.weight, head.bias), rtol=1e-5, atol=1e-5
            )
        assert list(vh.tuner.choices().values())[0] in ("linear", "rows", copy_kernel)
    finally:
        torch.set_num_threads(before)


def _assisted(target, ids, assistant, **kw):
    out = target.generate(ids, max_new_tokens=40, do_sample=False, assistant_model=assistant, **kw)
    return out, assistant.last_stats


def test_greedy_parity_on_large_vocab_targets():
    """Llama, and Gemma-3 with a logit softcap, 40k vocabularies (the head is installed): outputs equal
    plain greedy, with a repetition penalty too."""
    llama_t = tiny_models.llama(vocab_size=40000, block_scale=0.005)
    gemma_t = tiny_models.gemma3(vocab_size=40000, block_scale=0.1)
    gemma_t.config.final_logit_softcapping = 3.0
    for target in (llama_t, gemma_t):
        drafter = tiny_models.noisy_copy(target, noise=0.5)
        for prompt in tiny_models.random_prompts(2, seed=2):
            for kw in ({}, {"repetition_penalty": 1.3}):
                ref = target.generate(prompt, max_new_tokens=40, do_sample=False, **kw)
                for a in (
                    hf_cascade.CascadeAssistant([MaxGram()], cpu_kernels=True),
                    hf_cascade.CascadeAssistant([drafter, MaxGram()], cpu_kernels=True),
                ):
                    out, _ = _assisted(target, prompt, a, **kw)
                    assert torch.equal(out, ref)
        assert "forward" not in vars(target.get_output_embeddings())
