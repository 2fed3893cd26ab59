"""GLIDE + CAPE decoding under sampling is lossless (hf_cascade.glide, Du et al. ICML 2024): the statistical
tests of test_sampling.py (per-step calibration of the emitted tokens, joint distribution of the first two
tokens) on GlideAssistant settings beyond the contract's (min_confidence, verify_cost), and their
detection of a lying GLIDE. The trees are deterministic (``draft_probs=None``), so ``sampling_tree_accept``
runs its point-mass case. GLIDE and GLIDE+CAPE with their default settings (joint distribution and
calibration with temperature and top-k): tests/test_contract.py."""

from __future__ import annotations

import pytest
import torch

from hf_cascade.glide import GlideAssistant
from hf_cascade.core.budget import VerifyCost
from tests.test_glide_decode import echo_glide
from tests.test_sampling import PROMPT as SPROMPT
from tests.test_sampling import calibration, passes, run_long, small  # noqa: F401  (fixture)
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)


@pytest.mark.parametrize("cape,kw,extra", [(True, {}, {"min_confidence": 0.4, "min_expansion_prob": 0.05, "verify_cost": None}),
                                           (True, {"temperature": 1.3}, {"verify_cost": VerifyCost((1.0, 1.0, 1.0, 1.0, 1.2))})])
def test_sampling_calibration(small, cape, kw, extra, free_drafts):
    target = small["target"]
    a = GlideAssistant(echo_glide(target, 0.3), cape=cape, draft_length=3, max_tree_nodes=10, cpu_kernels=False, **extra)
    seqs = run_long(target, a, 6, 80, 0, **kw)
    stats = calibration(target, None, seqs, SPROMPT.shape[1], kw.get("temperature", 1.0), kw.get("top_k"))
    assert stats["n"] == 6 * 80 and passes(stats), stats
    s = a.last_stats
    assert 0 < sum(s.accepted_per_call) < sum(s.tree_depths)


def test_calibration_detects_a_lying_glide(small, monkeypatch):
    """The same test fails when the (deterministic) tree is passed off as drawn from a uniform ``q``."""
    from hf_cascade.glide.assistant import GlideDrafter

    honest = GlideDrafter.draft_tree

    def lying(self, seq, state):
        tree, _ = honest(self, seq, state)
        return tree, torch.full((tree.num_nodes, 16), 1.0 / 16)

    monkeypatch.setattr(GlideDrafter, "draft_tree", lying)
    target = small["target"]
    a = GlideAssistant(echo_glide(target, 0.3), cape=True, draft_length=3, max_tree_nodes=10, cpu_kernels=False,
                       verify_cost=None)        # drafts at every step, so the lie shows
    seqs = run_long(target, a, 4, 60, 0)
    stats = calibration(target, None, seqs, SPROMPT.shape[1])
    assert not passes(stats), stats
