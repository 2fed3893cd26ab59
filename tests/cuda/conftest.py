"""GPU tests (tests/cuda): the contract of tests/test_contract.py on CUDA devices.

Every test here is marked ``cuda`` and skipped when ``torch.cuda.is_available()`` is false, so a plain
``python -m pytest -q`` on a CPU machine collects and skips them; on a GPU machine run them with
``python -m pytest -q tests/cuda`` (or ``-m cuda``), and deselect them with ``-m "not cuda"``.
The ``real_model`` marker and the rest of the shared setup live in tests/conftest.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (tests/cuda; skipped without one)")


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """Mark every test of this directory ``cuda``, and skip it without a CUDA device (this hook sees every
    collected item: only this directory's are touched)."""
    skip = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.cuda)
            if skip is not None:
                item.add_marker(skip)


@pytest.fixture
def cuda() -> torch.device:
    return torch.device("cuda", 0)
