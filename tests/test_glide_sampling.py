"""GLIDE + CAPE decoding under sampling is lossless (hf_cascade.glide, Du et al. ICML 2024): the statistical
tests of test_sampling.py (per-step calibration of the emitted tokens) on GlideAssistant settings beyond the
contract's (min_confidence, verify_cost); the drawn main path (hf_cascade.core.draws: drawn tokens hand their
warped ``q`` to verification, argmax tokens and CAPE siblings are point masses) forced at every step, under the
contract's joint law of the first three tokens and its calibration, and its detection of a GLIDE that lies about
its draws; the per-call choice between drawing and the argmax. GLIDE and GLIDE+CAPE with their default settings:
tests/test_contract.py."""

from __future__ import annotations

import pytest
import torch

from hf_cascade import CapeSettings, GlideSettings, Policy
from hf_cascade.core.payoff import VerifyCost
from hf_cascade.glide import GlideAssistant
from tests.test_glide_decode import echo_glide
from tests.test_sampling import PROMPT as SPROMPT
from tests.test_sampling import calibration, passes, run_long, small  # noqa: F401  (fixture)
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)


@pytest.mark.parametrize(
    "kw,settings,policy",
    [
        ({}, GlideSettings(3, CapeSettings(max_nodes=10, min_prob=0.05), min_confidence=0.4), Policy(cost_aware=False)),
        (
            {"temperature": 1.3},
            GlideSettings(3, CapeSettings(max_nodes=10)),
            Policy(verify_cost=VerifyCost((1.0, 1.0, 1.0, 1.0, 1.2))),
        ),
    ],
)
def test_sampling_calibration(small, kw, settings, policy, free_drafts):
    target = small["target"]
    a = GlideAssistant(echo_glide(target, 0.3), settings=settings, policy=policy, cpu_kernels=False)
    seqs = run_long(target, a, 6, 80, 0, **kw)
    stats = calibration(target, None, seqs, SPROMPT.shape[1], kw.get("temperature", 1.0), kw.get("top_k"))
    assert stats["n"] == 6 * 80 and passes(stats), stats
    s = a.last_stats
    assert 0 < sum(s.accepted_per_call) < sum(s.tree_depths)


@pytest.fixture
def always_draw(monkeypatch):
    """GLIDE draws its main path at every step (not only while draws are ahead: core.draws.ProposalChoice)."""
    from hf_cascade.core.draws import ProposalChoice

    monkeypatch.setattr(
        ProposalChoice, "table", lambda self, device: torch.ones(len(self.rate), dtype=torch.bool, device=device)
    )


@pytest.mark.parametrize("cape", [False, True])
def test_drawn_main_path_is_exact(always_draw, cape):
    """The drawn main path (core.draws) under the contract's two tests: the joint law of the first three tokens,
    untouched and under temperature, top-k, top-p and a repetition penalty, and the per-step calibration."""
    from tests.contract_registry import base_kit
    from tests.test_contract import JOINT_RUNS, SAMPLING_KW, calibrate, joint_test

    target = base_kit("small").target
    glide = echo_glide(target, 0.0)

    def make():
        return GlideAssistant(
            glide, settings=GlideSettings(cape=cape), policy=Policy(cost_aware=False), cpu_kernels=False
        )  # drafts at every step

    for sampling in ({}, SAMPLING_KW):
        joint = joint_test(target, make(), runs=JOINT_RUNS, seed=1000, **sampling)
        assert passes(joint) and joint["accepted"] > 0, (sampling, joint)
    cal = calibrate(target, make())
    assert passes(cal) and 0 < cal["accepted"] < cal["drafted"], cal


def test_drawn_main_path_with_lookup_seeds_is_exact(always_draw, monkeypatch):
    """Lookup seeds (drafters.lookup_branch) beside a drawn main path and CAPE's siblings: separate point-mass
    siblings, never merged with a drawn node, chosen independently of the draws; the contract's joint law of the
    first three tokens (untouched and processed) and its per-step calibration still hold."""
    from hf_cascade.drafters.lookup_branch import LookupBranch
    from tests.contract_registry import base_kit
    from tests.test_contract import JOINT_RUNS, SAMPLING_KW, calibrate, joint_test

    target = base_kit("small").target
    glide = echo_glide(target, 0.0)
    beside_draws = []
    select = LookupBranch.select

    def spy(self, budget, tree, probs, tokens, depth, linear=False, drawn=0):
        out = select(self, budget, tree, probs, tokens, depth, linear, drawn)
        if drawn:
            beside_draws.append(sum(p is None for p in out[1]))  # seed-only nodes verified beside draws
        return out

    monkeypatch.setattr(LookupBranch, "select", spy)

    def make():
        return GlideAssistant(glide, policy=Policy(verify_cost=VerifyCost.flat()), cpu_kernels=False)

    for sampling in ({}, SAMPLING_KW):
        joint = joint_test(target, make(), runs=JOINT_RUNS, seed=2000, **sampling)
        assert passes(joint) and joint["accepted"] > 0, (sampling, joint)
    cal = calibrate(target, make())
    assert passes(cal) and 0 < cal["accepted"] < cal["drafted"], cal
    assert sum(beside_draws) > 0 and len(beside_draws) > 20


@pytest.mark.parametrize("cape", [False, True])
def test_joint_law_detects_a_glide_lying_about_its_draws(always_draw, monkeypatch, cape):
    """Negative control of the drawn main path (hf_cascade.core.draws, rule 1): the contract's joint test of the
    first three tokens fails for a GLIDE that draws its tokens from a flattened ``q ** 0.25`` but hands
    verification ``q`` (as forgetting a temperature warper would); the honest GLIDE passes the same runs."""
    from hf_cascade.glide import drafter as glide_drafter
    from tests.contract_registry import base_kit
    from tests.test_contract import JOINT_RUNS, joint_test

    target = base_kit("small").target
    glide = echo_glide(target, 0.0)

    def make():
        return GlideAssistant(
            glide, settings=GlideSettings(cape=cape), policy=Policy(cost_aware=False), cpu_kernels=False
        )  # drafts at every step

    honest = glide_drafter.draw
    assert passes(joint_test(target, make(), runs=JOINT_RUNS, seed=1000))

    def lying_draw(warpers, logits, generator=None):
        _, q = honest(warpers, logits, generator)
        flat = q**0.25
        return torch.multinomial(flat / flat.sum(), 1, generator=generator)[0], q

    monkeypatch.setattr(glide_drafter, "draw", lying_draw)
    lied = joint_test(target, make(), runs=JOINT_RUNS, seed=1000)
    assert not passes(lied), lied


def test_glide_draws_only_while_draws_pay(small, monkeypatch):
    """Without forcing: an echo GLIDE (its ``q`` close to the tiny target's rows) measures draws ahead of its
    argmax and draws; each call starts from the argmax (the choice lives and dies with the call)."""
    from hf_cascade.glide.drafter import GlideDrafter

    target = small["target"]
    a = GlideAssistant(
        echo_glide(target, 0.0),
        settings=GlideSettings.chain(draft_length=3),
        policy=Policy(cost_aware=False),
        cpu_kernels=False,
    )
    honest, seen = GlideDrafter.draft_tree, []

    def spy(self, seq, state):
        seen.append((state.step, self.choice.draws()))
        return honest(self, seq, state)

    monkeypatch.setattr(GlideDrafter, "draft_tree", spy)
    run_long(target, a, 2, 40, 0)
    assert [d for step, d in seen if step == 0] == [False, False] and any(d for _, d in seen)
