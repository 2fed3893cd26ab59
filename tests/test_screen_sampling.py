"""The argmax screen under sampling: rows top-k filtered are computed from the screen's candidates alone
(:meth:`ArgmaxScreen.top <hf_cascade.backends.cpu.argmax_screen.ArgmaxScreen.top>`,
:func:`hf_cascade.processors.screen_top_k`).

(1) golden: the top rows, processed by temperature, top-k and top-p, are the full rows processed, also with
    near-ties at the k-th logit; (2) the rule deciding where that holds; (3) exact sampling with the screen in
    use, at batch 1 and per row of a batch: the first three tokens' joint law and the per-step calibration pass,
    and a screen that keeps one output too few fails them (negative control)."""

from __future__ import annotations

import time
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from transformers import LogitsProcessorList
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from hf_cascade import CascadeAssistant, MaxGram, assistant
from hf_cascade.backends import VerifySession
from hf_cascade.backends.cpu.argmax_screen import ArgmaxScreen
from hf_cascade.backends.cpu.panel import PANEL
from hf_cascade.processors import screen_top_k
from tests.contract_registry import base_kit
from tests.sampling_stats import calibration, passes
from tests.test_batch_sampling import joint_passes, joint_test_batch
from tests.test_contract import SPROMPT, FakeClock, joint_test
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.skipif(not PANEL.available(), reason="the panel kernel did not build on this machine")

KW = {"temperature": 1.3, "top_k": 6, "top_p": 0.95}


def _warpers(k: int) -> LogitsProcessorList:
    return LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(k), TopPLogitsWarper(0.9)])


def test_top_rows_process_to_the_full_rows():
    g = torch.Generator().manual_seed(5)
    base = torch.randn(3000, 48, generator=g) / 8
    w = torch.cat([base, base[:40] + torch.randn(40, 48, generator=g) * 1e-5])  # near-copies: ties at any k
    screen = ArgmaxScreen(w)
    x = torch.cat([w[:8] * 40, torch.randn(24, 48, generator=g) * 30])
    full = F.linear(x, w)
    for k in (1, 2, 7, 50):
        top = screen.top(x, k)
        kept = torch.isfinite(top)
        assert (kept.sum(dim=1) >= k).all()
        assert torch.allclose(top[kept], full[kept], atol=1e-4)  # exact where kept
        kth = full.topk(k, dim=1).values[:, -1:]
        assert (full[~kept] < kth.expand_as(full)[~kept]).all()  # dropped: below the k-th
        ids = torch.zeros(x.shape[0], 1, dtype=torch.long)
        a, b = _warpers(k)(ids, full.clone()), _warpers(k)(ids, top.clone())
        assert torch.equal(torch.isfinite(a), torch.isfinite(b))
        assert torch.allclose(a.softmax(-1), b.softmax(-1), atol=1e-5)


def test_screen_top_k_rule():
    assert screen_top_k(_warpers(9)) == 9
    assert screen_top_k(LogitsProcessorList([TopKLogitsWarper(4)])) == 4
    assert screen_top_k(LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.2), TopKLogitsWarper(4)])) is None
    assert screen_top_k(LogitsProcessorList([TemperatureLogitsWarper(0.7), TopPLogitsWarper(0.9)])) is None
    assert screen_top_k(LogitsProcessorList([TopKLogitsWarper(4, filter_value=-1e4)])) is None
    assert screen_top_k(LogitsProcessorList()) is None


@pytest.fixture
def forced_screen(monkeypatch):
    """Every generate() of an hf_cascade assistant runs with the screen of the small target's head, whatever its
    speed (the small vocabulary is below the CPU backend's head); ``uses`` records (rows, top_k) per request."""
    target = base_kit("small").target
    screen, uses = ArgmaxScreen(target.get_output_embeddings().weight), []

    @contextmanager
    def session(model, cpu_kernels=None, kind=None):
        yield VerifySession("cpu", 2, lambda rows, top_k=None: uses.append((rows, top_k)) or screen)

    monkeypatch.setattr(assistant, "verification_session", session)
    monkeypatch.setattr(time, "perf_counter", FakeClock())
    return target, screen, uses


def _calibrate(target, runs: int = 4, new: int = 60) -> dict:
    prompt, seqs, accepted = SPROMPT, [], 0
    for c in range(runs):
        torch.manual_seed(c)
        a = CascadeAssistant([MaxGram()])
        seqs.append(target.generate(prompt, do_sample=True, max_new_tokens=new, assistant_model=a, **KW)[0])
        accepted += sum(a.last_stats.accepted_per_call)
    stats = calibration(target, None, seqs, prompt.shape[1], **KW)
    stats["accepted"] = accepted
    return stats


def test_sampling_with_the_top_k_screen_is_exact(forced_screen):
    target, screen, uses = forced_screen
    joint = joint_test(target, CascadeAssistant([MaxGram()]), runs=100, seed=1000, **KW)
    assert passes(joint) and joint["accepted"] > 0, joint
    cal = _calibrate(target)
    assert passes(cal) and cal["accepted"] > 0, cal
    assert uses and all(k == KW["top_k"] for _, k in uses) and screen.candidates > 0


def test_batched_sampling_with_the_top_k_screen_is_exact(forced_screen, open_gate):
    target, screen, uses = forced_screen
    joint = joint_test_batch(target, CascadeAssistant([MaxGram()]), **KW)
    assert all(map(joint_passes, joint)) and joint[0]["accepted"] > 0, joint
    assert uses and max(rows for rows, _ in uses) > 2 and screen.candidates > 0  # several rows' first blocks


def test_a_screen_keeping_one_output_too_few_is_detected(forced_screen, monkeypatch):
    """Negative control: the same runs with the top ``k - 1`` outputs kept instead of ``k`` fail."""
    target, screen, _ = forced_screen
    honest = ArgmaxScreen.top
    monkeypatch.setattr(ArgmaxScreen, "top", lambda self, x, k: honest(self, x, k - 1) if k > 1 else honest(self, x, k))
    joint = joint_test(target, CascadeAssistant([MaxGram()]), runs=100, seed=1000, temperature=1.3, top_k=4)
    assert not passes(joint), joint
