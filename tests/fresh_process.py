"""Run a script in a fresh interpreter, offline and without hf_cascade on the path: how a user who
downloaded a checkpoint loads its remote code (``trust_remote_code=True``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_offline(script: str, cwd: Path, timeout: int = 600) -> str:
    """Run ``script`` with ``python -c`` in ``cwd`` (hub offline, no ``PYTHONPATH``, a private
    remote-code module cache); assert it succeeds and return its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_MODULES_CACHE=str(Path(cwd) / "modules"), OMP_NUM_THREADS="1"
    )
    res = subprocess.run(
        [sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout
