"""The CPU verification head (hf_cascade/verify_head.py): same logits, restored afterwards, parity."""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessor, LogitsProcessorList, SuppressTokensLogitsProcessor

import hf_cascade
from hf_cascade import MaxGram
from hf_cascade import verify_head
from hf_cascade.kernels import TUNER, KernelTuner
from hf_cascade.verify_head import GreedyPlan, VerificationHead, fast_verification_head

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


# -- lazy rows: only the rows greedy acceptance reads (GreedyPlan) ------------------------------

def _identity_head(vocab: int = 5) -> VerificationHead:
    head = nn.Linear(vocab, vocab, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.eye(vocab))        # logits = hidden: rows are written by hand
    return VerificationHead(head, block_rows=2)


# candidates: 2 prompt tokens, then drafts 3 4 2 1 0 (k = 5, 6 rows). Hidden rows (= logits) argmax:
# 3 4 1 ... : drafts 0 and 1 accepted, draft 2 (token 2) rejected at row 2 (the target says 1).
_CANDIDATES = torch.tensor([[0, 1, 3, 4, 2, 1, 0]])
_HIDDEN = torch.tensor([
    [0., 0., 0., 5., 1.],
    [0., 0., 0., 1., 5.],
    [0., 5., 1., 0., 0.],
    [5., 0., 0., 0., 0.],
    [0., 0., 5., 0., 0.],
    [0., 0., 0., 0., 5.],
])


def _plan(candidates=_CANDIDATES, processors=None, transform=lambda x: x):
    return GreedyPlan(candidates, 2, LogitsProcessorList(processors or []), transform)


def test_lazy_rows_stop_after_the_first_rejection():
    for block, computed in ((2, 4), (1, 3), (4, 4), (6, 6)):
        vh = _identity_head()
        vh.block_rows = block
        vh.validated = True
        vh.expect(_plan())
        out = vh(_HIDDEN[None])                                   # [1, 6, 5]
        assert torch.equal(out[0, :computed], _HIDDEN[:computed])
        assert torch.equal(out[0, computed:], torch.zeros(6 - computed, 5))
        assert (vh.rows_requested, vh.rows_computed) == (6, computed)
        # what transformers then does: argmax, leading matches, bonus token from the rejected row
        selected = out[0].argmax(-1)
        n = int(((selected[:-1] != _CANDIDATES[0, 2:]).cumsum(0) < 1).sum())
        assert n == 2 and int(selected[n]) == 1


def test_blocks_join_a_last_single_row():
    vh = _identity_head()
    vh.block_rows = 4
    assert vh.blocks(1) == [(0, 1)] and vh.blocks(4) == [(0, 4)] and vh.blocks(5) == [(0, 5)]
    assert vh.blocks(9) == [(0, 4), (4, 9)] and vh.blocks(10) == [(0, 4), (4, 8), (8, 10)]


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
        vh = VerificationHead(head, tuner=KernelTuner())                    # tuned: explores, then chooses
        for _ in range(12):
            torch.testing.assert_close(vh(x), torch.nn.functional.linear(x, head.weight, head.bias), rtol=1e-5, atol=1e-5)
        assert list(vh.tuner.choices().values())[0] in ("linear", "rows", copy_kernel)
    finally:
        torch.set_num_threads(before)


def test_lazy_rows_all_accepted_compute_the_bonus_row():
    vh = _identity_head()
    vh.validated = True
    cands = torch.tensor([[0, 1, 3, 4, 1, 0, 2]])
    vh.expect(_plan(cands))
    out = vh(_HIDDEN[None])
    assert torch.equal(out[0], _HIDDEN) and vh.rows_computed == 6


def test_lazy_rows_check_through_processors_and_transform():
    # suppressing token 3 makes row 0 pick 4: draft 0 (token 3) is rejected at once
    vh = _identity_head()
    vh.validated = True
    vh.expect(_plan(processors=[SuppressTokensLogitsProcessor([3])]))
    out = vh(_HIDDEN[None])
    assert vh.rows_computed == 2 and torch.equal(out[0, 2:], torch.zeros(4, 5))
    # a transform that reverses the order (never a real one) makes row 0 pick token 0: rejected too
    vh = _identity_head()
    vh.validated = True
    vh.expect(_plan(transform=lambda x: -x))
    vh(_HIDDEN[None])
    assert vh.rows_computed == 2


def test_plan_ignored_until_validated_and_used_once():
    vh = _identity_head()
    vh.expect(_plan())                                            # not validated: full rows
    assert torch.equal(vh(_HIDDEN[None])[0], _HIDDEN) and vh.rows_computed == 6
    vh.validated = True
    vh.expect(_plan())
    vh(_HIDDEN[None])
    vh(_HIDDEN[None])                                             # no plan any more: all rows
    assert vh.rows_computed == 6 + 4 + 6


def test_validate_compares_with_transformers_rows():
    plan = _plan(processors=[SuppressTokensLogitsProcessor([3])])
    processed = _HIDDEN.clone()
    processed[:, 3] = -float("inf")
    vh = _identity_head()
    vh(_HIDDEN[None])
    assert vh.validate(plan, processed[None]) is True and vh.validated
    vh = _identity_head()
    vh(_HIDDEN[None])
    assert vh.validate(plan, torch.tanh(processed[None])) is False  # a post-head transform it missed
    vh = _identity_head()
    vh(_HIDDEN[None, :4])
    assert vh.validate(plan, processed[None]) is None and vh.validated is None  # rows do not line up

    class Custom(LogitsProcessor):                                # user code: may hold state
        def __call__(self, input_ids, scores):
            return scores

    vh = _identity_head()
    vh(_HIDDEN[None])
    assert vh.validate(_plan(processors=[Custom()]), _HIDDEN[None]) is False


def _assisted(target, ids, assistant, **kw):
    out = target.generate(ids, max_new_tokens=40, do_sample=False, assistant_model=assistant, **kw)
    return out, assistant.last_stats


def test_lazy_rows_greedy_parity_on_large_vocab_targets(monkeypatch):
    """Llama, and Gemma-3 with a logit softcap, 40k vocabularies (the head is installed): outputs equal
    plain greedy, with a repetition penalty too, and rows after rejections are skipped."""
    monkeypatch.setattr(TUNER, "force", "linear")       # blocks of 4 rows, not a size calibrated on a tiny head
    llama_t = tiny_models.llama(vocab_size=40000, block_scale=0.005)
    gemma_t = tiny_models.gemma3(vocab_size=40000, block_scale=0.1)
    gemma_t.config.final_logit_softcapping = 3.0
    for target in (llama_t, gemma_t):
        drafter = tiny_models.noisy_copy(target, noise=0.5)
        for prompt in tiny_models.random_prompts(3, seed=2):
            for kw in ({}, {"repetition_penalty": 1.3}):
                ref = target.generate(prompt, max_new_tokens=40, do_sample=False, **kw)
                for a in (hf_cascade.CascadeAssistant([MaxGram()]), hf_cascade.CascadeAssistant([drafter, MaxGram()])):
                    out, stats = _assisted(target, prompt, a, **kw)
                    assert torch.equal(out, ref)
                    assert stats.head_rows_computed <= stats.head_rows_requested
        a = hf_cascade.CascadeAssistant([drafter], k_matrix=[[8]])
        out, stats = _assisted(target, tiny_models.random_prompts(1, seed=3)[0], a)
        assert stats.head_rows_computed < stats.head_rows_requested   # rejections happened and rows were skipped


def test_calibrated_block_rows(monkeypatch):
    """The largest of 1, 2, 3, 4, 8 rows whose call costs at most 1.2 one-row calls (medians of timed calls
    once the tuner has chosen); cached per head shape; the default block when the tuner does not time (a
    forced kernel)."""
    monkeypatch.setattr(verify_head, "_BLOCK_ROWS", {})
    costs = {1: 1.0, 2: 1.05, 3: 1.15, 4: 2.1, 8: 1.19}
    clock = {"now": 0.0, "ones": 0}

    class Costs(KernelTuner):
        """Chosen at once; a call of m rows takes costs[m] on a fake clock, except the first timed one-row
        call, which reads 0.5 (one fast outlier must not move the median)."""

        def run(self, key, kernels):
            clock["ones"] += key[4] == 1
            clock["now"] += 0.5 if key[4] == 1 and clock["ones"] == 1 else costs[key[4]]
            return next(iter(kernels.values()))()

        def seconds(self, key):
            return costs[key[4]]

    def tuner():
        clock["ones"] = 0
        return Costs(clock=lambda: clock["now"])

    head = nn.Linear(8, 40000)
    assert verify_head.calibrate_block_rows(VerificationHead(head, tuner=tuner())) == 8
    costs[8] = 2.6
    assert verify_head.calibrate_block_rows(VerificationHead(head, tuner=tuner())) == 8     # cached
    monkeypatch.setattr(verify_head, "_BLOCK_ROWS", {})
    assert verify_head.calibrate_block_rows(VerificationHead(head, tuner=tuner())) == 3
    assert verify_head.calibrate_block_rows(VerificationHead(nn.Linear(8, 40001), tuner=KernelTuner(force="rows"))) == 4
    with fast_verification_head(_Head(40000, 8, False)) as applied:                    # real timing: some size
        assert applied
    m = _Head(40000, 8, False)
    with fast_verification_head(m):
        assert verify_head.active_head(m).block_rows in (1, 2, 3, 4, 8)


def test_sampling_computes_every_row():
    target = tiny_models.llama(vocab_size=40000, block_scale=0.3)
    a = hf_cascade.CascadeAssistant([tiny_models.noisy_copy(target, noise=0.5)], k_matrix=[[6]])
    torch.manual_seed(0)
    target.generate(tiny_models.random_prompts(1)[0], max_new_tokens=20, do_sample=True, assistant_model=a)
    assert a.last_stats.head_rows_requested > 0
    assert a.last_stats.head_rows_computed == a.last_stats.head_rows_requested
