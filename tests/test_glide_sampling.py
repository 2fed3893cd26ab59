"""GLIDE + CAPE decoding under sampling is lossless (hf_cascade.glide, Du et al. ICML 2024): the statistical
tests of test_sampling.py (per-step calibration of the emitted tokens, joint distribution of the first two
tokens) on GlideAssistant, with and without CAPE, with logits processors. The trees are deterministic
(``draft_probs=None``), so ``sampling_tree_accept`` runs its point-mass case."""

from __future__ import annotations

import pytest
import torch

from hf_cascade.glide import GlideAssistant
from hf_cascade.tree.budget import VerifyCost
from tests.test_glide_decode import echo_glide
from tests.test_sampling import PROMPT as SPROMPT
from tests.test_sampling import calibration, joint_test, passes, run_long, small  # noqa: F401  (fixture)
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)


@pytest.mark.parametrize("cape,kw,extra", [(True, {}, {}), (True, {"temperature": 1.5, "top_k": 6}, {}),
                                           (True, {}, {"min_confidence": 0.4, "min_expansion_prob": 0.05}),
                                           (True, {"temperature": 1.3}, {"verify_cost": VerifyCost((1.0, 1.5, 1.6))})])
def test_sampling_calibration(small, cape, kw, extra):
    target = small["target"]
    a = GlideAssistant(echo_glide(target, 0.3), cape=cape, draft_length=3, max_tree_nodes=10, fast_head=False, **extra)
    seqs = run_long(target, a, 6, 80, 0, **kw)
    stats = calibration(target, None, seqs, SPROMPT.shape[1], kw.get("temperature", 1.0), kw.get("top_k"))
    assert stats["n"] == 6 * 80 and passes(stats), stats
    s = a.last_stats
    assert 0 < sum(s.accepted_per_call) < sum(s.tree_depths)


@pytest.mark.parametrize("cape", [False, True])
def test_sampling_first_two_tokens_joint_distribution(small, cape):
    a = GlideAssistant(echo_glide(small["target"], 0.3), cape=cape, draft_length=2, fast_head=False)
    chi2, limit, tv = joint_test(small["target"], a, runs=300, seed=500, temperature=1.3 if cape else 0.8)
    assert chi2 < limit, (chi2, limit, tv)


def test_calibration_detects_a_lying_glide(small, monkeypatch):
    """The same test fails when the (deterministic) tree is passed off as drawn from a uniform ``q``."""
    from hf_cascade.glide.assistant import GlideDrafter

    honest = GlideDrafter.draft_tree

    def lying(self, seq, state):
        tree, _ = honest(self, seq, state)
        return tree, torch.full((tree.num_nodes, 16), 1.0 / 16)

    monkeypatch.setattr(GlideDrafter, "draft_tree", lying)
    target = small["target"]
    a = GlideAssistant(echo_glide(target, 0.3), cape=True, draft_length=3, max_tree_nodes=10, fast_head=False)
    seqs = run_long(target, a, 4, 60, 0)
    stats = calibration(target, None, seqs, SPROMPT.shape[1])
    assert not passes(stats), stats
