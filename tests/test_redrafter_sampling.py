"""ReDrafter under sampling is lossless: beam search is a deterministic function of the context, so
its trees (packed, or flat with duplicated siblings) are verified as point-mass drafts
(``draft_probs=None``); checked with the statistical tests of test_sampling.py (per-step calibration
over long generations, joint distribution of the first two tokens) on beam shapes beyond the contract's,
and a chi-square test of ``sampling_tree_accept`` on a flat beam tree. The contract's packed 4 x 4 beams
(joint distribution, calibration with temperature and top-k): tests/test_contract.py."""

from __future__ import annotations

import pytest
import torch

from hf_cascade import Policy, ReDrafterAssistant, ReDrafterSettings
from hf_cascade.core.payoff import VerifyCost
from hf_cascade.redrafter import flat_tree
from tests.redrafter_helpers import fit_head
from tests.test_sampling import PROMPT, calibration, joint_test, passes, run_long, small  # noqa: F401  (fixture)
from tests.test_tree import assert_deterministic_tree_exact
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

T = torch.tensor


def test_sampling_tree_accept_on_flat_beams_is_exact():
    """Flat beams repeat their first tokens as siblings (and a whole beam twice): still exact."""
    assert_deterministic_tree_exact(flat_tree(T([[1, 2], [1, 4], [3, 0], [1, 2]])))


@pytest.fixture(scope="module")
def head(small):
    return fit_head(small["target"], "small", steps=60, L=3)


SAMPLING = {
    "flat": (dict(settings=ReDrafterSettings(3, 3, dedupe=False), policy=Policy(cost_aware=False)), {}),
    "wide_temp": (
        dict(settings=ReDrafterSettings(6, 4), policy=Policy(verify_cost=VerifyCost.flat())),  # the budget's path
        {"temperature": 0.7},
    ),
    "confident": (dict(settings=ReDrafterSettings(4, 4, min_confidence=0.2), policy=Policy(cost_aware=False)), {}),
}


@pytest.mark.parametrize("name", list(SAMPLING))
def test_per_step_calibration(small, head, name, free_drafts):
    settings, kw = SAMPLING[name]
    assistant = ReDrafterAssistant(head, cpu_kernels=False, **settings)
    seqs = run_long(small["target"], assistant, 8, 100, 0, **kw)
    stats = calibration(small["target"], None, seqs, PROMPT.shape[1], kw.get("temperature", 1.0), kw.get("top_k"))
    assert stats["n"] == 8 * 100
    assert passes(stats), stats
    st = assistant.last_stats
    assert 0 < sum(st.accepted_per_call) < sum(st.tree_depths)  # speculation, with rejections


def test_first_two_tokens_joint_distribution_flat_beams(small, head):
    chi2, limit, tv = joint_test(
        small["target"],
        ReDrafterAssistant(head, settings=ReDrafterSettings(beam_width=3, beam_length=2, dedupe=False)),
        runs=600,
        seed=900,
        temperature=1.3,
    )
    assert chi2 < limit, (chi2, limit, tv)
