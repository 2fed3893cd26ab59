"""HSDDW's Max-Gram lookup first (``Policy.lookup``, the default; not in the paper): on a
prompt the answer copies, the lookup drafts and gets accepted; greedy parity (also with ``max_new_tokens`` and an
EOS inside a lookup draft), ``lookup=False``, thresholds untouched by lookup steps. Its sampling exactness: the
sampling tests of ``tests/test_hsddw.py`` (lookup on, repetitive prompt) and ``tests/test_contract.py``."""

from __future__ import annotations

import time

import pytest

from hf_cascade import DynamicWindowAssistant, DynamicWindowSettings, MaxGram, Policy
from hf_cascade.hsddw import DynamicWindowCandidateGenerator
from tests.test_contract import FakeClock
from tests.test_greedy_parity import REPETITIVE, assert_parity, m, ours, plain  # noqa: F401  (m: fixture)
from tests.test_hsddw import NO_EOS, _copying_prompt
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

LOOKUP = {
    "sd": lambda m, max_window=6, **policy: DynamicWindowAssistant(
        m["noisy"], settings=DynamicWindowSettings(max_window, tau_init=2.0), policy=Policy(**policy)
    ),
    "hsddw": lambda m, max_window=3, **policy: DynamicWindowAssistant(
        m["noisy"],
        m["big"],
        settings=DynamicWindowSettings(max_window, tau_init=2.0, tau2_init=2.0),
        policy=Policy(**policy),
    ),
}


def _assert_lookup_drafted(stats):
    lv = stats.levels[-1]
    assert lv.name == "maxgram" and lv.forward_calls == 0
    assert lv.tokens_proposed > 0 and lv.tokens_accepted > 0, lv


@pytest.mark.parametrize("config", list(LOOKUP))
def test_lookup_greedy_parity_on_a_copying_prompt(m, config, monkeypatch):
    monkeypatch.setattr(time, "perf_counter", FakeClock())
    prompt = _copying_prompt(m)
    a = LOOKUP[config](m)
    assert a.lookup and "lookup=True" in repr(a)
    stats = assert_parity(m["target"], prompt, a, max_new_tokens=40, **NO_EOS)
    _assert_lookup_drafted(stats)
    drafted = stats.levels[0].tokens_proposed + stats.levels[-1].tokens_proposed
    assert drafted == sum(stats.window_per_step) and len(stats.window_per_step) == stats.target_calls
    assert stats.levels[-1].tokens_accepted / stats.levels[-1].tokens_proposed > 0.5  # the answer copies the prompt
    # thresholds only from the draft models' tokens: one tau per neural stage, tau2 per neural target step
    assert len(stats.tau_trajectory) == len(stats.draft_windows)
    if a.verifier_model is not None:
        assert len(stats.tau2_trajectory) == stats.levels[0].proposals
        assert set(stats.calls_per_model) == {"target", "verifier", "draft"}
    else:
        assert len(stats.draft_windows) == stats.levels[0].proposals
        assert set(stats.calls_per_model) == {"target", "draft"}
    off = LOOKUP[config](m, lookup=False)
    stats_off = assert_parity(m["target"], prompt, off, max_new_tokens=40, **NO_EOS)
    assert "maxgram" not in [lv.name for lv in stats_off.levels] and not stats_off.lookup
    assert stats.target_calls < stats_off.target_calls


@pytest.mark.parametrize("new", [1, 2, 3, 5, 9])
@pytest.mark.parametrize("config", list(LOOKUP))
def test_lookup_max_new_tokens_reached_mid_draft(m, config, new, monkeypatch):
    monkeypatch.setattr(time, "perf_counter", FakeClock())
    a = LOOKUP[config](m)
    stats = assert_parity(m["target"], _copying_prompt(m), a, max_new_tokens=new, **NO_EOS)
    assert stats.new_tokens == new and all(k <= new - 1 for k in stats.window_per_step)
    if new >= 3:
        _assert_lookup_drafted(stats)


@pytest.mark.parametrize("config", list(LOOKUP))
def test_lookup_cuts_its_draft_after_an_eos(m, config, monkeypatch):
    """An EOS the lookup copies from the prompt ends its draft, and generation, as in plain ``generate``."""
    monkeypatch.setattr(time, "perf_counter", FakeClock())
    target, prompt = m["target"], _copying_prompt(m)
    free = plain(target, prompt, max_new_tokens=20, **NO_EOS)[0, prompt.shape[1] :].tolist()
    eos = next(t for t in free[3:] if t in prompt[0].tolist() and t not in free[:3])
    raw, drafts = [], []
    propose, lookup_draft = MaxGram.propose, DynamicWindowCandidateGenerator._lookup_draft

    def spy_propose(self, *args, **kwargs):
        prop = propose(self, *args, **kwargs)
        raw.append(prop.tokens.tolist())
        return prop

    def spy_draft(self, *args):
        d = lookup_draft(self, *args)
        drafts.append(None if d is None else d.tokens.tolist())
        return d

    monkeypatch.setattr(MaxGram, "propose", spy_propose)
    monkeypatch.setattr(DynamicWindowCandidateGenerator, "_lookup_draft", spy_draft)
    a = LOOKUP[config](m, max_window=6)  # room for the EOS inside a lookup draft
    expected = plain(target, prompt, max_new_tokens=40, eos_token_id=eos)
    got = ours(target, prompt, a, max_new_tokens=40, eos_token_id=eos)
    assert got.tolist() == expected.tolist() and int(got[0, -1]) == eos
    assert a.last_stats.new_tokens == free.index(eos) + 1
    _assert_lookup_drafted(a.last_stats)
    for r, d in zip(raw, drafts):  # cut right after the first EOS, nothing drafted past it
        if d is not None:
            assert d == (r[: r.index(eos) + 1] if eos in r else r)
    assert any(d and d[-1] == eos for d in drafts)
    assert any(eos in r and r[-1] != eos for r in raw)  # the raw proposal went on past the EOS


def test_lookup_steps_do_not_update_the_thresholds(m, monkeypatch):
    """A rejected lookup token leaves tau alone (no entropies pending: no index error either)."""
    monkeypatch.setattr(time, "perf_counter", FakeClock())
    seen = []
    original = DynamicWindowCandidateGenerator.on_target_review

    def spy(self, seq, num_proposed, num_accepted, verify_seconds):
        before = (list(self.tau.rejected), list(self.tau2.rejected))
        lookup = self._lookup
        original(self, seq, num_proposed, num_accepted, verify_seconds)
        if lookup is not None:
            assert (self.tau.rejected, self.tau2.rejected) == before
            seen.append(num_accepted < num_proposed)

    monkeypatch.setattr(DynamicWindowCandidateGenerator, "on_target_review", spy)
    for config in LOOKUP:
        a = LOOKUP[config](m)
        stats = assert_parity(m["target"], REPETITIVE, a, max_new_tokens=40, **NO_EOS)
        assert stats.levels[-1].tokens_accepted < stats.levels[-1].tokens_proposed  # lookup rejections happened
    assert any(seen)
