"""``hf_cascade.profile_rounds``: a process's verification rounds pooled with the last ones kept for its machine."""

import pytest

from hf_cascade import measure, profile_rounds


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_CASCADE_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_CASCADE_PROFILE_ROUNDS", "1")
    return tmp_path / profile_rounds.FILE


def test_rounds_are_kept_per_key_and_the_last_ones_read(store):
    key, other = (profile_rounds.store_key(("cpu", f"{n} threads"), {"steps": 3}) for n in (1, 2))
    assert key != other and profile_rounds.kept_rounds(key) == []
    for i in range(7):
        profile_rounds.keep_rounds(key, [{0: 1.0, 1: 1.0 + i / 100}])
    profile_rounds.keep_rounds(other, [{0: 1.0, 1: 2.0}])
    with open(store, "a") as f:
        f.write('{"key": "cut by a concurrent wri')  # a torn line is skipped
    kept = profile_rounds.kept_rounds(key)
    assert [r[1] for r in kept] == pytest.approx([1.03, 1.04, 1.05, 1.06])  # the newest KEPT - 1, oldest first
    assert profile_rounds.rounds_to_measure(0) == profile_rounds.LEAST and profile_rounds.rounds_to_measure(4) == 1


def test_the_file_is_trimmed_to_the_last_rounds_of_each_key(store, monkeypatch):
    monkeypatch.setattr(profile_rounds, "TRIM_BYTES", 2000)
    for i in range(40):
        profile_rounds.keep_rounds(f"k{i % 2}", [{0: 1.0, 1: 1.0 + i / 100}])
    assert store.stat().st_size <= 2000 + 100
    assert [r[1] for r in profile_rounds.kept_rounds("k1")] == pytest.approx([1.33, 1.35, 1.37, 1.39])


def test_kept_rounds_off_and_unwritable(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("HF_CASCADE_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_CASCADE_PROFILE_ROUNDS", "0")
    profile_rounds.keep_rounds("k", [{0: 1.0}])
    assert not (tmp_path / profile_rounds.FILE).exists() and profile_rounds.kept_rounds("k") == []
    assert profile_rounds.rounds_to_measure(0) == 1  # one round of its own, as before
    monkeypatch.setenv("HF_CASCADE_PROFILE_ROUNDS", "1")
    monkeypatch.setenv("HF_CASCADE_CACHE", str(tmp_path / "a-file"))
    (tmp_path / "a-file").write_text("")
    profile_rounds.keep_rounds("k", [{0: 1.0}])  # a cache that is a file: warns only
    assert "cannot keep" in caplog.text
    assert profile_rounds.rounds_to_measure(0) == 1  # nothing can be kept: one round


@pytest.mark.measured_costs
def test_a_process_measures_one_round_once_enough_are_kept_and_a_spoiled_one_is_outvoted(store, monkeypatch):
    """The first process measures LEAST rounds; later ones one each, pooled with the kept ones: a process whose own
    round was spoiled (a first drafted node read 1.34) still sizes its trees from the sound ones."""
    sound, spoiled = {n: 1 + 0.04 * n for n in measure.QUICK_GRID}, {n: 1.34 + 0.02 * n for n in measure.QUICK_GRID}
    spoiled[0] = 1.0
    measured = []

    def fake_rounds(draw):
        return lambda model, rounds, **kw: measured.append(rounds) or [draw] * rounds

    model = object()
    monkeypatch.setattr(measure, "profile_key", lambda m: ("cpu", "fake", len(measured)))  # a new process each time
    monkeypatch.setattr(measure, "_MEASURED", {})
    monkeypatch.setattr(measure, "_ROUNDS", {})
    monkeypatch.setattr(profile_rounds, "store_key", lambda key, settings: "the machine")
    monkeypatch.setattr(measure, "store_key", profile_rounds.store_key)
    monkeypatch.setattr(measure, "_rounds", fake_rounds(sound))
    first = measure.measured_verify_cost(model)
    monkeypatch.setattr(measure, "_rounds", fake_rounds(spoiled))
    second = measure.measured_verify_cost(model)
    assert measured == [profile_rounds.LEAST, 1]
    assert first.relative == second.relative == pytest.approx([1 + 0.04 * n for n in range(25)])
    assert measure.measured_profiles()[-1]["rounds"] == {"measured": 1, "kept": profile_rounds.LEAST}


@pytest.mark.measured_costs
def test_reuse_measures_nothing_once_enough_are_kept(store, monkeypatch):
    """``HF_CASCADE_PROFILE_ROUNDS=reuse``: the first processes measure until LEAST rounds are kept, later ones
    none (their profile is the kept rounds' median); an unknown value is a clear error."""
    monkeypatch.setenv("HF_CASCADE_PROFILE_ROUNDS", "reuse")
    draw = {n: 1 + 0.05 * n for n in measure.QUICK_GRID}
    measured = []
    monkeypatch.setattr(measure, "profile_key", lambda m: ("cpu", "fake", len(measured)))  # a new process each time
    monkeypatch.setattr(measure, "_MEASURED", {})
    monkeypatch.setattr(measure, "_ROUNDS", {})
    monkeypatch.setattr(measure, "store_key", lambda key, settings: "the machine")
    monkeypatch.setattr(measure, "_rounds", lambda model, rounds, **kw: measured.append(rounds) or [draw] * rounds)
    profiles = [measure.measured_verify_cost(object()) for _ in range(3)]
    assert measured == [profile_rounds.LEAST]  # the first process; the next two measured nothing
    assert profiles[0].relative == profiles[2].relative == pytest.approx([1 + 0.05 * n for n in range(25)])
    assert measure.measured_profiles()[-1]["rounds"] == {"measured": 0, "kept": profile_rounds.LEAST}
    assert profile_rounds.rounds_to_measure(profile_rounds.LEAST - 1) == 1
    monkeypatch.setenv("HF_CASCADE_PROFILE_ROUNDS", "sometimes")
    with pytest.raises(ValueError, match="HF_CASCADE_PROFILE_ROUNDS='sometimes': expected 1"):
        profile_rounds.rounds_to_measure(0)
