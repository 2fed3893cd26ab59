"""The batch's draft gate (:mod:`hf_cascade.core.payoff.gate`) keeps batched outputs plain's: steps it refuses, the
width it allows (greedy parity; under sampling, each row's law), only the lagging rows drafting (and plain steps
recording nothing). The cases and the
settings are tests/test_batch.py's; the gate's rules themselves have golden tests in tests/test_adapt.py."""

from __future__ import annotations

import pytest

import hf_cascade  # noqa: F401  (installs the generate() hook)
from tests.contract_registry import fresh_kit, setting_target
from tests.test_batch import registry_assistant, setting_cases
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)


@pytest.mark.parametrize("name", ["drafter+maxgram", "hsddw", "glide_cape", "redrafter"])
def test_gate_refusals_keep_parity(name, free_drafts, monkeypatch):
    """Steps where the :class:`~hf_cascade.core.payoff.DraftGate` refuses drafts verify every row's root alone
    (width 1), between drafted steps or throughout; outputs stay plain's."""
    from hf_cascade.core.payoff import DraftGate

    target = setting_target("gemma3-sdpa")
    cases = [c for c in setting_cases("gemma3-sdpa") if c[0] in ("max_new_tokens_13", "eos_in_draft")]
    for every in (3, 1):  # refuse every third step, then every step

        def allows(gate, every=every):
            gate.steps = getattr(gate, "steps", 0) + 1
            return gate.steps % every != 0

        monkeypatch.setattr(DraftGate, "allows", allows)
        monkeypatch.setattr(DraftGate, "follows_lagging", False)  # every row drafts (tested apart)
        monkeypatch.setattr(DraftGate, "by_estimate", False)  # the rate rule (widths by estimate: apart)
        assistant = registry_assistant(name, fresh_kit("gemma3", target))
        for case, (input_ids, mask), kw, expected in cases:
            out = target.generate(input_ids, attention_mask=mask, do_sample=False, assistant_model=assistant, **kw)
            assert out.tolist() == expected, (case, every)
            widths = assistant.last_stats.width_per_call
            assert all(w == 1 for k, w in enumerate(widths, 1) if k % every == 0), (case, every, widths)
            if every > 1:
                assert max(widths) > 1, (case, widths)


@pytest.mark.parametrize("name", ["maxgram", "glide_cape", "redrafter", "recycling"])
def test_gate_width_keeps_parity(name, free_drafts, open_gate, monkeypatch):
    """Drafted steps under the gate's :attr:`~hf_cascade.core.payoff.DraftGate.width` verify each row's first
    ``width`` nodes only (1 and 2 here: every step at most ``width + 1`` wide); outputs stay plain's."""
    from hf_cascade.core.payoff import DraftGate

    target = setting_target("llama-sdpa")
    cases = [c for c in setting_cases("llama-sdpa") if c[0] in ("max_new_tokens_13", "eos_in_draft")]
    for width in (1, 2):
        init = DraftGate.__init__

        def narrow(gate, *a, width=width, init=init, **k):
            init(gate, *a, **k)
            gate.width = width

        monkeypatch.setattr(DraftGate, "__init__", narrow)
        monkeypatch.setattr(DraftGate, "observe", lambda gate, *a, **k: None)  # the width stays as set
        assistant = registry_assistant(name, fresh_kit("llama", target))
        for case, (input_ids, mask), kw, expected in cases:
            out = target.generate(input_ids, attention_mask=mask, do_sample=False, assistant_model=assistant, **kw)
            assert out.tolist() == expected, (case, width)
            assert max(assistant.last_stats.width_per_call) <= width + 1, (case, width)


@pytest.mark.parametrize("name", ["glide_cape", "redrafter"])
def test_gate_width_keeps_sampling_exact(name, free_drafts, open_gate, monkeypatch):
    """Under sampling, a draft cut to its first ``width`` nodes (2 here: a tree may lose some of a node's
    children, and their draw probabilities with them) keeps each row's law the target's: the joint law of the
    first tokens and the per-step calibration pass, with drafts accepted and rejected."""
    import time

    from hf_cascade.core.payoff import DraftGate
    from tests.contract_registry import base_kit
    from tests.test_batch_sampling import assert_exact_batch_sampling
    from tests.test_contract import FakeClock

    init = DraftGate.__init__

    def narrow(gate, *a, **k):
        init(gate, *a, **k)
        gate.width = 2

    monkeypatch.setattr(DraftGate, "__init__", narrow)
    monkeypatch.setattr(DraftGate, "observe", lambda gate, *a, **k: None)  # the width stays as set
    monkeypatch.setattr(time, "perf_counter", FakeClock())  # reproducible runs
    target = base_kit("small").target
    kit = fresh_kit("small", target)
    assert_exact_batch_sampling(target, lambda: registry_assistant(name, kit))


@pytest.mark.parametrize("name", ["maxgram", "glide_cape", "recycling"])
@pytest.mark.parametrize("ride_share", [0.0, 1e9])
def test_only_lagging_rows_draft_and_plain_steps_record_nothing(name, ride_share, free_drafts, monkeypatch):
    """The gate open, its default rule: the rows with the most tokens left draft; the others' drafters see a
    budget of 0, unless they ride along (``ride_share``: never, or always where allowed), then within the width the
    lagging rows' drafts set and never for a drafter that reads the target's cache; a step where no row drafted
    gives the drafters no rows (``state.rows is None``); outputs stay plain's, and drafts were accepted."""
    from hf_cascade.core import batch
    from hf_cascade.core.payoff import DraftGate

    monkeypatch.setattr(DraftGate, "follows_lagging", True)
    monkeypatch.setattr(DraftGate, "ride_share", ride_share)
    steps, draft = [], batch.draft

    def record(run, b, allowed=True, limit=None):
        left = [row.stopper.max_length - row.width for row in run.rows]
        tree, q = draft(run, b, allowed, limit)
        steps.append((left[b] == max(left), allowed, limit, tree.num_nodes))
        return tree, q

    monkeypatch.setattr(batch, "draft", record)
    target = setting_target("llama-sdpa")
    assistant = registry_assistant(name, fresh_kit("llama", target))
    given, new_drafter = [], assistant.new_drafter

    def watched(*args, **kwargs):  # each row's drafter: what its on_accept is given
        drafter = new_drafter(*args, **kwargs)
        on_accept = drafter.on_accept
        drafter.on_accept = lambda tree, acc, state: given.append(state.rows) or on_accept(tree, acc, state)
        return drafter

    monkeypatch.setattr(assistant, "new_drafter", watched)
    accepted = 0
    for case, (input_ids, mask), kw, expected in setting_cases("llama-sdpa"):
        out = target.generate(input_ids, attention_mask=mask, do_sample=False, assistant_model=assistant, **kw)
        assert out.tolist() == expected, case
        accepted += sum(sum(r.accepted_per_call) for r in assistant.last_stats.rows)
    assert accepted > 0
    assert all(limit is None for lagging, _, limit, _ in steps if lagging)  # the lagging rows: the gate's width
    rides = [(allowed, limit, n) for lagging, allowed, limit, n in steps if not lagging]
    assert name == "maxgram" or rides  # rows got ahead (drafting at every step)
    assert all(limit is not None and n <= limit and (allowed or n == 0) for allowed, limit, n in rides)
    if ride_share == 0.0 or name == "glide_cape":  # GLIDE reads the target's cache: never rides
        assert all(not allowed for allowed, _, _ in rides)
    else:  # every row ahead rides where the lagging rows drafted
        assert all(allowed == (limit > 0) for allowed, limit, _ in rides)
    assert any(rows is None for rows in given) and any(rows is not None for rows in given)


@pytest.mark.parametrize("name", ["maxgram", "drafter+maxgram", "maxgram_first_cost_aware"])
def test_estimated_widths_keep_parity(name, free_drafts, monkeypatch):
    """Where every lagging row estimates its draft's reach (the cascade's drafts do), the gate cuts the step's
    drafts to the width :meth:`~hf_cascade.core.payoff.DraftGate.width_for` gives: cycled here through 0 (a plain
    step), 1, 2 and 3 nodes, so that every width is exercised deterministically; outputs stay plain's, no step
    is wider, and the estimates the gate was given are probabilities that do not grow with depth."""
    from hf_cascade.core.payoff import DraftGate

    given, widths = [], [0, 1, 2, 3]

    def width_for(gate, reaches, rows):
        given.extend(reaches)
        gate.steps = getattr(gate, "steps", -1) + 1
        return widths[gate.steps % len(widths)]

    monkeypatch.setattr(DraftGate, "allows", lambda gate: True)
    monkeypatch.setattr(DraftGate, "follows_lagging", False)  # every row drafts: more cut drafts
    monkeypatch.setattr(DraftGate, "width_for", width_for)
    target = setting_target("llama-sdpa")
    assistant = registry_assistant(name, fresh_kit("llama", target))
    for case, (input_ids, mask), kw, expected in setting_cases("llama-sdpa"):
        out = target.generate(input_ids, attention_mask=mask, do_sample=False, assistant_model=assistant, **kw)
        assert out.tolist() == expected, case
        calls = assistant.last_stats.width_per_call
        assert all(w <= 4 for w in calls), (case, calls)
    assert given and any(len(r) > 1 for r in given)
    assert all(0 < p <= 1 for r in given for p in r) and all(a >= b for r in given for a, b in zip(r, r[1:]))


def test_the_cascade_learns_from_the_verified_prefix_only():
    """A batch may verify only the first tokens of a row's draft: the cascade's Max-Gram acceptance counts those,
    not the cut ones as rejected (:meth:`~hf_cascade.cascade.drafter._Drafted.first`)."""
    import torch

    from hf_cascade.cascade.drafter import CascadeCandidateGenerator, _Drafted, _Segment
    from hf_cascade.core.payoff import DraftPolicy
    from hf_cascade.drafters.maxgram import MaxGram

    policy = DraftPolicy.lookahead(MaxGram())
    d = _Drafted(torch.tensor([5, 6, 7, 8]), None, [1.0] * 4, [0] * 4, [False] * 4, [_Segment(policy, 3, 0, 4)])
    cut = d.first(2)
    assert cut.tokens.tolist() == [5, 6] and cut.segments[0].length == 2 and len(cut) == 2
    assert d.first(9) is d
    before = policy.acceptance(3)
    CascadeCandidateGenerator._feedback_segments(cut.segments, 2)  # both verified tokens accepted
    assert policy.acceptance(3) > before  # no rejection counted


def test_rides_rule():
    """A row ahead rides along only into a width the lagging rows set, with a drafter that reads no copy of the
    target's cache and whose drafts took at most ``ride_share`` of the last step (unmeasured: it rides, to be
    measured)."""
    from types import SimpleNamespace

    from hf_cascade.core.payoff import DraftGate

    def run(draft_seconds, reads_cache=False, last_step=0.1):
        gate = DraftGate()
        gate.last_step = last_step
        drafter = SimpleNamespace(reads_target_cache=reads_cache)
        return SimpleNamespace(gate=gate, rows=[SimpleNamespace(drafter=drafter, draft_seconds=draft_seconds)])

    def rides(run, b, width):
        return run.gate.rides(run.rows[b], width)

    share = DraftGate.ride_share
    assert rides(run(None), 0, 3) and rides(run(share * 0.1), 0, 1)
    assert not rides(run(None), 0, 0)  # the lagging rows drafted nothing
    assert not rides(run(None, reads_cache=True), 0, 3)  # GLIDE: a gather per layer
    assert not rides(run(share * 0.1 * 1.01), 0, 3)  # dearer than its share of a step
    assert rides(run(1.0, last_step=None), 0, 3)  # no step measured yet


@pytest.mark.measured_costs
def test_gate_idles_after_costly_drafts_cut_to_nothing():
    """Golden: with estimates, drafts that cost more than ``ride_share`` of a step and were cut to width 0 stop the
    next steps' drafting except every ``explore_every``-th, then every 16th at most; a width above 0, or drafts as
    cheap as a lookup, keep every step drafting."""
    from hf_cascade.core.payoff import DraftGate

    gate = DraftGate(explore_every=4)
    gate.estimated, gate.last_step = True, 0.1
    gate.sized_to(0, 0.001)  # a lookup cut to nothing: costs nothing, keeps drafting
    assert [gate.allows() for _ in range(3)] == [True] * 3
    gate.sized_to(0, 0.05)  # a drafter's forwards cut to nothing
    assert [gate.allows() for _ in range(8)] == [False, False, False, True] * 2
    gate.sized_to(0, 0.05)
    gate.sized_to(0, 0.05)
    gate.sized_to(0, 0.05)
    assert gate.idle_interval == 16
    gate.sized_to(3, 0.05)  # a draft that pays: every step drafts again
    assert [gate.allows() for _ in range(3)] == [True] * 3
