"""Timed rounds kept between processes, so that one process's timing is not the whole story: the verification
profile's, and the cost curve the output head's block is priced from (:mod:`hf_cascade.backends.cpu.head_block`,
each process's per-size medians pooled the same way).

:func:`hf_cascade.measure.measured_verify_cost` times the target's verification in symmetric rounds
(:func:`hf_cascade.timing.round_ratios`). One round is a noisy draw: on a CPU shared with another process a round's
relative costs move by about a tenth between rounds, and a transient that is not linear over a round (another
process loading a model) can make the first drafted node look a third dearer than it is, after which the tree
assistants refuse their drafts for the whole process. So each process measures one round (more while fewer are
kept), adds it to a small file under :func:`hf_cascade.models.cache_dir`, and uses the per-size median of the last
:data:`KEPT` rounds of the same key: a spoiled round is outvoted, and the one-time cost stays one round. The key
holds everything the costs depend on (:func:`hf_cascade.measure.profile_key`, the CPU model, the torch and package
versions, the measurement's settings). ``HF_CASCADE_PROFILE_ROUNDS`` (:func:`mode`): ``1`` (the default) as above;
``reuse`` measures nothing once :data:`LEAST` rounds are kept (a process that starts often, a server or a test suite,
then starts without the measurement: the kept rounds decide); ``0`` keeps nothing on disk (every process then times
one round of its own, the draw this module exists to outvote). Only speed depends on it, never an output.
"""

from __future__ import annotations

import json
import logging
import os
import platform
from importlib import metadata
from pathlib import Path

import torch

#: Rounds a profile is the median of, at most (the newest kept) and at least (this process measures the rest).
KEPT = 5
LEAST = 3
FILE = "verify_profile_rounds.jsonl"
#: Past this size the file is rewritten with the last :data:`KEPT` rounds of each key.
TRIM_BYTES = 1 << 18
_log = logging.getLogger(__name__)


MODES = ("1", "reuse", "0")


def mode() -> str:
    """``HF_CASCADE_PROFILE_ROUNDS``: ``"1"`` (default: each process measures one round, more while fewer than
    :data:`LEAST` are kept), ``"reuse"`` (none once :data:`LEAST` are kept) or ``"0"`` (nothing kept: one round of the
    process's own). ``ValueError`` for any other value."""
    value = os.environ.get("HF_CASCADE_PROFILE_ROUNDS", "1").strip().lower()
    if value not in MODES:
        raise ValueError(f"HF_CASCADE_PROFILE_ROUNDS={value!r}: expected 1 (default), reuse or 0")
    return value


def _path() -> Path | None:
    if mode() == "0":
        return None
    from .models import cache_dir

    return cache_dir() / FILE


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def store_key(key: tuple, settings: dict) -> str:
    """The text a kept round is filed under: ``key`` (:func:`hf_cascade.measure.profile_key`), the CPU, the torch
    and package versions, and the measurement's ``settings`` (grid, steps, prompt length)."""
    return json.dumps(
        [list(map(str, key)), _cpu_name(), torch.__version__, _package_version(), settings], sort_keys=True
    )


def _package_version() -> str:
    try:
        return metadata.version("hf-cascade")
    except metadata.PackageNotFoundError:  # run from a checkout without installing
        return "unknown"


def kept_rounds(key: str) -> list[dict[int, float]]:
    """The last :data:`KEPT` - 1 rounds filed under ``key`` (oldest first); none where nothing is kept or the file
    cannot be read."""
    path = _path()
    if path is None or not path.is_file():
        return []
    rounds = []
    try:
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut by a concurrent writer
            if rec.get("key") == key:
                rounds.append({int(n): float(r) for n, r in rec["ratios"].items()})
    except OSError as err:
        _log.warning("hf_cascade: cannot read the kept verification rounds (%s)", err)
        return []
    return rounds[-(KEPT - 1) :]


def keep_rounds(key: str, rounds: list[dict[int, float]]) -> None:
    """Append this process's ``rounds`` under ``key`` (one line each, one write); a failure only warns."""
    path = _path()
    if path is None or not rounds:
        return
    text = "".join(
        json.dumps({"key": key, "ratios": {str(n): r for n, r in sorted(rnd.items())}}) + "\n" for rnd in rounds
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(text)
        if path.stat().st_size > TRIM_BYTES:
            _trim(path)
    except OSError as err:
        _log.warning("hf_cascade: cannot keep the verification rounds (%s)", err)


def _trim(path: Path) -> None:
    """Rewrite ``path`` with the last :data:`KEPT` lines of each key (a temporary file, then an atomic replace)."""
    last: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        try:
            last.setdefault(json.loads(line)["key"], []).append(line)
        except (ValueError, KeyError, TypeError):
            continue
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text("".join(line + "\n" for lines in last.values() for line in lines[-KEPT:]))
    os.replace(tmp, path)


def _writable(path: Path) -> bool:
    """Whether ``path`` can be appended to: it, or else its nearest existing folder, is writable."""
    for p in (path, *path.parents):
        if p.exists():
            return os.access(p, os.W_OK) and (p == path or p.is_dir())
    return False


def rounds_to_measure(kept: int) -> int:
    """How many rounds this process measures when ``kept`` are on file: at least one, enough for :data:`LEAST`;
    none under ``reuse`` once :data:`LEAST` are kept; one where nothing is kept (``HF_CASCADE_PROFILE_ROUNDS=0``,
    or a cache this process cannot write: each process times its own round)."""
    path = _path()
    if path is None or not _writable(path):
        return 1
    return 0 if mode() == "reuse" and kept >= LEAST else max(1, LEAST - kept)


__all__ = ["FILE", "KEPT", "LEAST", "MODES", "mode", "keep_rounds", "kept_rounds", "rounds_to_measure", "store_key"]
