"""A local Hugging Face Hub cache built in a test's tmp dir, and offline mode, for loading by repo id.

:func:`add_repo` lays files out as ``huggingface_hub`` stores a downloaded repo::

    <cache>/models--<org>--<name>/blobs/<sha256 of each file>
                                 /refs/main                 (the commit sha)
                                 /snapshots/<commit sha>/<files>   (hard links to the blobs, else copies)

so ``from_pretrained(repo_id, cache_dir=cache)`` / ``hf_hub_download`` resolve it offline, by
``revision=<sha>`` or by the ``main`` ref. :func:`offline` turns the Hub's offline mode on in-process
(``huggingface_hub`` and transformers read ``HF_HUB_OFFLINE`` at import, so the environment variable
alone does not reach an interpreter that has imported them); :func:`hub_env` is the environment of a
fresh interpreter with ``HF_HUB_CACHE`` set to the cache (the default-cache route).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

CARDS = Path(__file__).resolve().parent.parent / "model_cards"
#: The Hub id of the real target, as the README and the cards name it (a test's cache holds a saved copy).
TARGET = "google/gemma-3-270m"


def other_repo(folder: str) -> str:
    """The repo id a test's cache stores a shipped folder under, as a user who uploaded it might: another org and
    another name than the folder's (``gemma-3-270m-glide-xs`` -> ``someone/my-glide-xs``). Nothing is published
    under an hf_cascade org: the cards' and the README's snippets must work under any repo id."""
    return "someone/my-" + folder.removeprefix("gemma-3-270m-")


#: Repo id (:func:`other_repo`) of each shipped folder of model_cards/.
SHIPPED_REPOS = {other_repo(d.name): d for d in sorted(CARDS.iterdir()) if d.is_dir()}


def commit_sha(repo_id: str, src: Path | None = None) -> str:
    """A deterministic 40-hex 'commit' for ``repo_id`` (and the names and sizes of the files of ``src``)."""
    h = hashlib.sha1(repo_id.encode())
    if src is not None:
        for f in sorted(p for p in Path(src).rglob("*") if p.is_file()):
            h.update(f"{f.relative_to(src)}:{f.stat().st_size}".encode())
    return h.hexdigest()


def add_repo(
    cache: Path, repo_id: str, src: Path, sha: str | None = None, ref: str | None = "main", skip: tuple[str, ...] = ()
) -> str:
    """Copy the files of the directory ``src`` into ``cache`` as the snapshot ``sha`` of the model repo
    ``repo_id`` (files named in ``skip`` left out); point ``refs/<ref>`` at it; return the sha."""
    sha = sha or commit_sha(repo_id, src)
    root = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    snap = root / "snapshots" / sha
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    for f in sorted(p for p in Path(src).rglob("*") if p.is_file()):
        rel = f.relative_to(src)
        if rel.name in skip or rel.parts[0] in (".git", "__pycache__"):
            continue
        digest = _sha256(f)
        blob = root / "blobs" / digest
        if not blob.exists():
            shutil.copyfile(f, blob)
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(blob, snap / rel)  # a second name of the blob: no second copy of large files
        except OSError:
            shutil.copyfile(blob, snap / rel)
    if ref:
        (root / "refs").mkdir(exist_ok=True)
        (root / "refs" / ref).write_text(sha)
    return sha


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def offline(monkeypatch) -> None:
    """Hub offline mode in this interpreter (``huggingface_hub`` and, on transformers 4.x, its copy)."""
    import huggingface_hub.constants as hc
    import transformers.utils.hub as th

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    if hasattr(th, "_is_offline_mode"):
        monkeypatch.setattr(th, "_is_offline_mode", True)


def hub_env(cache: Path, tmp: Path) -> dict:
    """Environment of a fresh interpreter using ``cache`` as its default Hub cache, offline."""
    env = dict(os.environ)
    env.update(
        HF_HUB_CACHE=str(cache),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_MODULES_CACHE=str(Path(tmp) / "modules"),
        OMP_NUM_THREADS="1",
    )
    return env
