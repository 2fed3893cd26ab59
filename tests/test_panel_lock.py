"""An interrupted first build of the panel kernel leaves torch's build lock, on which every later process would wait
without end: ``clear_stale_lock`` removes a lock older than any build, and leaves a fresh one (a build running)."""

import os

import pytest

from hf_cascade.backends.cpu.panel import clear_stale_lock


def test_a_stale_lock_is_removed_and_a_fresh_one_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    from torch.utils.cpp_extension import _get_build_directory

    lock = tmp_path / "ext" / "lock"
    assert _get_build_directory("ext", verbose=False) == str(lock.parent)
    lock.write_text("")
    assert not clear_stale_lock("ext") and lock.exists()  # a build may be running
    os.utime(lock, (lock.stat().st_atime, lock.stat().st_mtime - 3600))
    with pytest.warns(RuntimeWarning, match="stale build lock"):
        assert clear_stale_lock("ext")
    assert not lock.exists()
    assert not clear_stale_lock("ext")  # none left
