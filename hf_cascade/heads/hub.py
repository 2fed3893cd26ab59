"""Save heads in Hub layout (weights + remote code + model card); :func:`hf_cascade.loading.load_head` loads them back
strictly."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from . import register_heads
from .cards import front_matter, license_section

CARD_TAGS = ["hf-cascade", "speculative-decoding", "drafter"]


def save_hub(model, path: str | os.PathLike, card: str | dict = "") -> Path:
    """Save ``model`` to ``path`` as a self-contained Hub repository.

    Writes model.safetensors, config.json (with ``auto_map``), the configuration/modeling files it names,
    generation_config.json and README.md. ``card`` is the model card's markdown body, or a dict of extra
    front-matter fields (``license``, ``datasets``, ``pipeline_tag``, ...) whose optional ``"body"`` key holds
    the markdown and optional ``"sources"`` key the distillation sources (for the licence note). ``license`` and
    ``base_model`` default to those of ``config.target_name_or_path`` (:mod:`hf_cascade.heads.cards`); with a
    licence that has a note and no ``## License`` section in the body, the section is appended.
    """
    register_heads()
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    config = json.loads((path / "config.json").read_text())
    auto_map = config.get("auto_map")
    if not auto_map:
        raise RuntimeError(
            f"{path}/config.json has no auto_map: is {type(model).__name__} a registered hf_cascade head?"
        )
    for ref in auto_map.values():
        module = (ref[0] if isinstance(ref, (list, tuple)) else ref).split("--")[-1].rsplit(".", 1)[0]
        if not (path / f"{module}.py").is_file():
            raise RuntimeError(f"save_pretrained did not copy {module}.py (named by auto_map) to {path}.")
    if not (path / "model.safetensors").is_file() and not list(path.glob("model-*.safetensors")):
        raise RuntimeError(f"No safetensors weights in {path}.")

    meta = dict(card) if isinstance(card, dict) else {}
    body = str(meta.pop("body", "")) if isinstance(card, dict) else str(card)
    sources = meta.pop("sources", None)
    front = front_matter(config.get("target_name_or_path"), meta, tags=CARD_TAGS)
    if "## License" not in body:
        body = body.strip() + "\n\n" + license_section(front.get("license"), sources)
    text = "---\n" + yaml.safe_dump(front, sort_keys=False, allow_unicode=True) + "---\n\n" + body.strip() + "\n"
    (path / "README.md").write_text(text, encoding="utf-8")
    return path
