"""Tree-verified decoding under sampling is lossless: the statistical tests of test_sampling.py on
stochastic trees that hand the target their draft probabilities, and their detection of a lying ``q``
(split from test_tree_decode.py). Max-Gram trees (``MaxGramTreeAssistant``): tests/test_contract.py."""

from __future__ import annotations

import pytest
import torch

from hf_cascade.core import TokenTree
from hf_cascade.core.strategy import TreeDrafter
from tests.test_sampling import PROMPT as SPROMPT
from tests.test_sampling import calibration, joint_test, passes, run_long, small  # noqa: F401  (fixture)
from tests.test_tree_decode import Using
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

T = torch.tensor

# -- sampling: lossless --------------------------------------------------------------------------------


class SampledTree(TreeDrafter):
    """A stochastic tree: ``width`` i.i.d. children of the root from a drafter model's ``q``, one
    child each below them; ``lie`` reports a uniform ``q`` instead of the true one."""

    def __init__(self, drafter, width=3, lie=False):
        self.drafter, self.width, self.lie = drafter, width, lie

    def draft_tree(self, seq, state):
        if state.budget < 1:
            return TokenTree(seq.new_zeros(0), seq.new_zeros(0)), None
        with torch.no_grad():
            q0 = self.drafter(seq[None]).logits[0, -1].float().softmax(-1)
            kids = torch.multinomial(q0, self.width, replacement=True)
            tokens, parents, probs = [kids], [torch.full_like(kids, -1)], [q0.expand(self.width, -1)]
            if state.budget >= 2:
                batch = torch.cat([seq.expand(self.width, -1), kids[:, None]], dim=1)
                q1 = self.drafter(batch).logits[:, -1].float().softmax(-1)
                tokens.append(torch.multinomial(q1, 1).flatten())
                parents.append(torch.arange(self.width))
                probs.append(q1)
        q = torch.cat(probs)
        if self.lie:
            q = torch.full_like(q, 1.0 / q.shape[-1])
        return TokenTree(torch.cat(tokens), torch.cat(parents)), q


SAMPLING = {
    "sampled_tree": (lambda s: Using(lambda: SampledTree(s["noisy"])), "noisy", {}),
    "sampled_tree_temp": (lambda s: Using(lambda: SampledTree(s["noisy"])), "noisy", {"temperature": 0.8}),
}


def _calibrate(small, make, drafter, kw, seed=0):
    assistant = make(small)
    seqs = run_long(small["target"], assistant, 8, 100, seed, **kw)
    stats = calibration(
        small["target"],
        small[drafter] if drafter else None,
        seqs,
        SPROMPT.shape[1],
        kw.get("temperature", 1.0),
        kw.get("top_k"),
    )
    return stats, assistant


@pytest.mark.parametrize("name", list(SAMPLING))
def test_per_step_calibration(small, name):
    make, drafter, kw = SAMPLING[name]
    stats, assistant = _calibrate(small, make, drafter, kw)
    assert stats["n"] == 8 * 100
    assert passes(stats), stats
    st = assistant.last_stats
    assert 0 < sum(st.accepted_per_call) < sum(st.tree_depths)  # speculation, with rejections


def test_per_step_calibration_detects_a_wrong_q(small):
    stats, _ = _calibrate(small, lambda s: Using(lambda: SampledTree(s["noisy"], lie=True)), "noisy", {})
    assert not passes(stats), stats


def test_first_two_tokens_joint_distribution(small):
    sampled = Using(lambda: SampledTree(small["noisy"]))
    chi2, limit, tv = joint_test(small["target"], sampled, runs=600, seed=900, temperature=1.3)
    assert chi2 < limit, (chi2, limit, tv)


# -- errors ----------------------------------------------------------------------------------------
