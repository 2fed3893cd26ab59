"""Batched speculative decoding, exact sampling per row (point 4 of tests/test_batch.py): on the contract's
16-token vocabulary, each row's first three sampled tokens against the exact joint law, and per-step calibration
of each row's long generations (temperature, top-k); a sampler that lies about ``q`` fails both."""

from __future__ import annotations

import time

import pytest
import torch

import hf_cascade  # noqa: F401  (installs the generate() hook)
from tests.contract_registry import REGISTRY, base_kit, fresh_kit, input_device
from tests.sampling_stats import calibration, passes
from tests.test_batch import left_pad, registry_assistant
from tests.test_contract import JPROMPT, SAMPLING_KW, SPROMPT, FakeClock, V, binned_chi2, exact_first_three, lie_about_q
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

# -- (4) exact sampling per row ---------------------------------------------------------------------------------

#: rows of the joint test: JPROMPT twice (its Max-Gram drafts are often accepted within three tokens, so a wrong
#: ``q`` shows), and two other lengths
JOINT_ROWS = [JPROMPT[0].tolist(), SPROMPT[0].tolist(), JPROMPT[0].tolist(), [1, 13]]
JOINT_RUNS = 60
#: rows of the calibration: SPROMPT twice (the contract's calibration prompt), two other prompts
CALIBRATION_ROWS = [SPROMPT[0].tolist(), [1, 9, 12], SPROMPT[0].tolist(), [5]]
CALLS, NEW = 2, 60


def _groups(rows: list[list[int]]) -> dict[tuple, list[int]]:
    out: dict[tuple, list[int]] = {}
    for b, r in enumerate(rows):
        out.setdefault(tuple(r), []).append(b)
    return out


def joint_test_batch(
    model, assistant, rows=JOINT_ROWS, runs: int = JOINT_RUNS, seed: int = 1000, **sampling
) -> list[dict]:
    """The first three tokens of each row of ``runs`` sampled batches against the row's
    :func:`exact_first_three`: one chi-square per row, and one per prompt over its rows pooled (``sampling``:
    ``generate``'s processor keywords, none of them a repetition penalty)."""
    device = input_device(model)
    input_ids, mask = left_pad(rows, device=device)
    counts = torch.zeros(len(rows), V, V, V)
    accepted = 0
    for r in range(runs):
        torch.manual_seed(seed + r)
        out = model.generate(
            input_ids, attention_mask=mask, do_sample=True, max_new_tokens=3, assistant_model=assistant, **sampling
        )[:, -3:].tolist()
        for b, tokens in enumerate(out):
            counts[(b, *tokens)] += 1
        accepted += sum(sum(s.accepted_per_call) for s in assistant.last_stats.rows)
    results = []
    for prompt, group in _groups(rows).items():
        exact = exact_first_three(model, ids(*prompt), **sampling).flatten()
        for members in [[b] for b in group] + ([group] if len(group) > 1 else []):
            chi2, limit = binned_chi2(counts[members].sum(0).flatten(), exact * runs * len(members))
            results.append({"rows": members, "chi2": chi2, "limit": limit, "accepted": accepted})
    return results


def calibrate_batch(
    model, assistant, rows=CALIBRATION_ROWS, calls: int = CALLS, new: int = NEW, seed: int = 0
) -> list[dict]:
    """Per-step calibration (:func:`calibration`) of each prompt's rows (its padding stripped) over ``calls``
    sampled batches of ``new`` tokens, with temperature, top-k, top-p and a repetition penalty."""
    device = input_device(model)
    input_ids, mask = left_pad(rows, device=device)
    seqs: list[list[torch.Tensor]] = [[] for _ in rows]
    accepted = drafted = 0
    for c in range(calls):
        torch.manual_seed(seed + c)
        out = model.generate(
            input_ids, attention_mask=mask, do_sample=True, max_new_tokens=new, assistant_model=assistant, **SAMPLING_KW
        )
        for b, row in enumerate(rows):
            seqs[b].append(out[b, input_ids.shape[1] - len(row) :])
        accepted += sum(sum(s.accepted_per_call) for s in assistant.last_stats.rows)
        drafted += sum(sum(s.tree_depths) for s in assistant.last_stats.rows)
    results = []
    for prompt, group in _groups(rows).items():
        stats = calibration(model, None, [s for b in group for s in seqs[b]], len(prompt), **SAMPLING_KW)
        stats.update(rows=group, accepted=accepted, drafted=drafted)
        results.append(stats)
    return results


def joint_passes(result: dict) -> bool:
    return result["chi2"] < result["limit"]


def assert_exact_batch_sampling(target, make_assistant) -> None:
    """Each row's law is the target's (``target``: 16-token vocabulary), with drafts accepted and rejected."""
    joint = joint_test_batch(target, make_assistant())
    assert all(map(joint_passes, joint)), joint
    assert joint[0]["accepted"] > 0, joint
    cal = calibrate_batch(target, make_assistant())
    assert sum(s["n"] for s in cal) == CALLS * NEW * len(CALIBRATION_ROWS)
    assert all(map(passes, cal)), cal
    assert 0 < cal[0]["accepted"] < cal[0]["drafted"], cal


SAMPLING_ASSISTANTS = list(REGISTRY)  # every assistant of the contract


@pytest.mark.parametrize("name", SAMPLING_ASSISTANTS)
def test_exact_sampling_per_row(name, monkeypatch, free_drafts, open_gate):
    monkeypatch.setattr(time, "perf_counter", FakeClock())  # timed decisions: reproducible runs
    target = base_kit("small").target
    kit = fresh_kit("small", target)
    assert_exact_batch_sampling(target, lambda: registry_assistant(name, kit))


def test_exact_sampling_detects_a_wrong_q(monkeypatch, open_gate):
    """Negative control: the same tests, same runs and seeds, fail for a batched sampler that lies about ``q`` (the
    core's acceptance, :mod:`hf_cascade.core.phases`, which every row of a batch calls)."""
    lie_about_q(monkeypatch)
    monkeypatch.setattr(time, "perf_counter", FakeClock())
    target = base_kit("small").target
    kit = fresh_kit("small", target)
    joint = joint_test_batch(target, REGISTRY["maxgram"](kit))
    assert not all(map(joint_passes, joint)), joint
    cal = calibrate_batch(target, REGISTRY["maxgram"](kit))
    assert not all(map(passes, cal)), cal
