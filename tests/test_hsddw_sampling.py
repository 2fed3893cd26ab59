"""HSDDW (``DynamicWindowAssistant``) under sampling: lossless at the target (per-step calibration, a lying ``q``
detected, the ``q`` of a resampled token, the entropy taken on the ``q`` handed to the target). The statistical tests
come from ``tests/test_sampling.py``; greedy and the rules: ``tests/test_hsddw.py``."""

from __future__ import annotations

import pytest
import torch

from hf_cascade import DynamicWindowAssistant, DynamicWindowSettings
from hf_cascade.core.review import output_distribution
from hf_cascade.hsddw import DynamicWindowCandidateGenerator, entropy
from tests.test_sampling import PROMPT, _lying_q, calibration, passes, processed_probs, run_long, small  # noqa: F401
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

INF = float("inf")


# -- sampling: lossless at the target ---------------------------------------------------------------

SAMPLING = {
    "sd": (lambda s: DynamicWindowAssistant(s["noisy"], settings=DynamicWindowSettings(max_window=4)), {}),
    "sd_fixed_temp_topk": (
        lambda s: DynamicWindowAssistant(s["noisy"], settings=DynamicWindowSettings(max_window=5, tau_init=INF)),
        {"temperature": 1.5, "top_k": 6},
    ),
    # "hsddw" (noisy, noisy2, max_window=4): tests/test_contract.py
    "hsddw_fixed_temp": (
        lambda s: DynamicWindowAssistant(
            s["noisy"],
            s["noisy2"],
            settings=DynamicWindowSettings(max_window=2, tau_init=INF, tau2_init=INF, max_target_window=6),
        ),
        {"temperature": 0.8},
    ),
}


def _calibrate(small, name, calls=8, new=100, seed=0):
    make, kw = SAMPLING[name]
    a = make(small)
    seqs = run_long(small["target"], a, calls, new, seed, **kw)
    stats = calibration(
        small["target"], small["noisy"], seqs, PROMPT.shape[1], kw.get("temperature", 1.0), kw.get("top_k")
    )
    return stats, a


@pytest.mark.parametrize("name", list(SAMPLING))
def test_sampling_per_step_calibration(small, name, monkeypatch):
    runs, new_stats = [], DynamicWindowAssistant.new_stats
    monkeypatch.setattr(DynamicWindowAssistant, "new_stats", lambda self: runs.append(new_stats(self)) or runs[-1])
    stats, a = _calibrate(small, name)
    assert stats["n"] == 8 * 100
    assert passes(stats), stats
    st = a.last_stats
    assert 0 < sum(st.accepted_per_call) < sum(st.draft_len_per_call)
    if a.verifier_model is not None:
        assert 0 < st.levels[1].tokens_accepted < st.levels[1].tokens_proposed  # pre-verifier rejections
    # the lookup (default) drafted on this repetitive prompt: point masses accepted and rejected
    assert a.lookup and len(runs) == 8 and all(r.levels[-1].name == "maxgram" for r in runs)
    assert 0 < sum(r.levels[-1].tokens_accepted for r in runs) < sum(r.levels[-1].tokens_proposed for r in runs)


def test_sampling_calibration_detects_a_wrong_q(small, monkeypatch):
    _lying_q(monkeypatch, "uniform")
    stats, _ = _calibrate(small, "hsddw_fixed_temp")
    assert not passes(stats), stats


def _target_output(q1, p2, p, q_resampled):
    """Exact law of the target's output at one position when the pre-verifier's token is handed over:
    the small model draws ``x ~ q1``, the pre-verifier accepts it with ``min(1, p2 / q1)`` (handed with
    ``q = p2``) or draws from its residual (handed with ``q = q_resampled(residual)``); the target then
    runs speculative sampling with that ``q``."""

    def target_review(token_mass, q):  # tokens with (unnormalised) law token_mass, handed with q
        accept, residual = output_distribution(q[None], p[None])
        return token_mass * accept[0] + (token_mass * (1 - accept[0])).sum() * residual[0]

    accept2, residual2 = output_distribution(q1[None], p2[None])
    kept = q1 * accept2[0]
    return target_review(kept, p2) + (1 - kept.sum()) * target_review(residual2[0], q_resampled(residual2[0], p2))


def test_q_of_a_resampled_token_must_be_the_marginal_p2():
    """Why the q handed to the target is ``sampling_review``'s ``dists`` (= ``p2`` for accepted and
    resampled tokens alike) and not the residual a resampled token is drawn from given a rejection."""
    marginal = lambda residual, p2: p2  # noqa: E731  (what DynamicWindowCandidateGenerator hands over)
    residual = lambda residual, p2: residual  # noqa: E731
    q1, p2, p = torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]), torch.tensor([0.5, 0.5])
    torch.testing.assert_close(_target_output(q1, p2, p, marginal), p)
    torch.testing.assert_close(_target_output(q1, p2, p, residual), torch.tensor([0.75, 0.25]))  # lossy
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        q1, p2, p = (x / x.sum() for x in torch.rand(3, 6, generator=g) ** 4)
        torch.testing.assert_close(_target_output(q1, p2, p, marginal), p)
    assert (_target_output(q1, p2, p, residual) - p).abs().sum() > 1e-3


def test_entropy_is_taken_on_the_q_handed_to_the_target(small, monkeypatch):
    """Under sampling with temperature and top-k, the entropies the thresholds use are those of the
    exact ``q`` handed to the target's verification."""
    seen, lookups = [], []
    original = DynamicWindowCandidateGenerator.draft

    def spy(self, seq, budget):
        d = original(self, seq, budget)
        if self._lookup is not None:  # a lookup step: point masses, no entropies for the thresholds
            assert self._pending.numel() == 0 and d.dists is not None
            torch.testing.assert_close(d.dists, torch.nn.functional.one_hot(d.tokens, d.dists.shape[-1]).float())
            lookups.append(d.tokens.numel())
        elif d.dists is not None and d.tokens.numel():
            seen.append((torch.cat([seq, d.tokens])[None], d.dists, self._pending.clone()))
        return d

    monkeypatch.setattr(DynamicWindowCandidateGenerator, "draft", spy)
    for a, handing in (
        (DynamicWindowAssistant(small["noisy"], settings=DynamicWindowSettings(max_window=4, tau_init=1.0)), "noisy"),
        (
            DynamicWindowAssistant(
                small["noisy"],
                small["noisy2"],
                settings=DynamicWindowSettings(max_window=4, tau_init=1.0, tau2_init=1.0),
            ),
            "noisy2",
        ),
    ):
        seen.clear()
        torch.manual_seed(0)
        small["target"].generate(PROMPT, do_sample=True, max_new_tokens=30, temperature=0.7, top_k=8, assistant_model=a)
        assert len(seen) > 5
        levels = a.last_stats.levels
        assert levels[-1].tokens_accepted < levels[-1].tokens_proposed  # rejections (and resampled tokens) happened
        for candidates, q, used in seen:
            torch.testing.assert_close(entropy(q), used, atol=1e-4, rtol=1e-4)
            # and q is exactly the processed distribution of the model handing the tokens over
            # (with a pre-verifier: its own p2, for accepted and resampled tokens alike)
            k = q.shape[0]
            with torch.no_grad():
                logits = small[handing](candidates).logits[0, -k - 1 : -1]
            torch.testing.assert_close(q, processed_probs(logits, 0.7, 8), atol=1e-5, rtol=1e-4)
    assert lookups, "no lookup step ran: the lookup branch's checks above were not exercised"
