"""Save heads in Hub layout (weights + remote code + model card) and load them back strictly."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml
from transformers import AutoModelForCausalLM

from . import register_heads

CARD_TAGS = ["hf-cascade", "speculative-decoding", "drafter"]


def save_hub(model, path: str | os.PathLike, card: str | dict = "") -> Path:
    """Save ``model`` to ``path`` as a self-contained Hub repository.

    Writes model.safetensors, config.json (with ``auto_map``), the configuration/modeling files it names,
    generation_config.json and README.md. ``card`` is the model card's markdown body, or a dict of extra
    front-matter fields (``license``, ``datasets``, ``base_model``, ...) whose optional ``"body"`` key holds
    the markdown. ``base_model`` defaults to ``config.target_name_or_path`` when that is a Hub id.
    """
    register_heads()
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    config = json.loads((path / "config.json").read_text())
    auto_map = config.get("auto_map")
    if not auto_map:
        raise RuntimeError(f"{path}/config.json has no auto_map: is {type(model).__name__} a registered hf_cascade head?")
    for ref in auto_map.values():
        module = (ref[0] if isinstance(ref, (list, tuple)) else ref).split("--")[-1].rsplit(".", 1)[0]
        if not (path / f"{module}.py").is_file():
            raise RuntimeError(f"save_pretrained did not copy {module}.py (named by auto_map) to {path}.")
    if not (path / "model.safetensors").is_file() and not list(path.glob("model-*.safetensors")):
        raise RuntimeError(f"No safetensors weights in {path}.")

    meta = dict(card) if isinstance(card, dict) else {}
    body = str(meta.pop("body", "")) if isinstance(card, dict) else str(card)
    front = {"library_name": "transformers", "tags": list(CARD_TAGS)}
    target = config.get("target_name_or_path")
    if target and not os.path.exists(target) and target.count("/") == 1:
        front["base_model"] = target
    for key, value in meta.items():
        front[key] = CARD_TAGS + [t for t in value if t not in CARD_TAGS] if key == "tags" else value
    text = "---\n" + yaml.safe_dump(front, sort_keys=False, allow_unicode=True) + "---\n\n" + body.strip() + "\n"
    (path / "README.md").write_text(text, encoding="utf-8")
    return path


def load_head(path: str | os.PathLike, **kw):
    """``AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True, **kw)``, strictly: a checkpoint
    whose tensors are missing, unexpected or of the wrong shape for its config raises ``ValueError``
    instead of leaving freshly initialised weights. ``output_loading_info=True`` is honoured."""
    want_info = kw.pop("output_loading_info", False)
    kw.setdefault("trust_remote_code", True)
    if kw.get("ignore_mismatched_sizes"):
        raise ValueError("load_head never ignores mismatched sizes; use from_pretrained directly for that.")
    try:
        model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, **kw)
    except RuntimeError as e:  # 4.x: "... size mismatch for ..."; 5.x: "You set `ignore_mismatched_sizes` ..."
        if "mismatch" in str(e) or "shape" in str(e):
            raise ValueError(
                f"Checkpoint {path} does not match its config.json: the tensor shapes in its safetensors "
                f"differ from those the config (hidden_size, draft_vocab_size, ...) implies"
                f"{_shape_report(path, kw.get('trust_remote_code'))}. transformers said: {e}"
            ) from e
        raise
    problems = {k: list(info.get(k) or []) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    problems = {k: v for k, v in problems.items() if v}
    if problems or info.get("error_msgs"):
        detail = "; ".join(f"{k}: {v[:5]}{' ...' if len(v) > 5 else ''}" for k, v in problems.items())
        raise ValueError(
            f"Checkpoint {path} does not match its config.json ({detail or info.get('error_msgs')}); "
            "refusing to use a model with re-initialised weights."
        )
    return (model, info) if want_info else model


def _shape_report(path, trust_remote_code) -> str:
    """``": name ckpt [a, b] vs config [c, d], ..."`` for the first mismatched tensors (best effort)."""
    try:
        import torch
        from safetensors import safe_open
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
        expected = {k: list(v.shape) for k, v in model.state_dict().items()}
        diffs = []
        for file in sorted(Path(path).glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    shape = list(f.get_slice(key).get_shape())
                    if key in expected and expected[key] != shape:
                        diffs.append(f"{key} ckpt {shape} vs config {expected[key]}")
        return (": " + ", ".join(diffs[:3]) + (f" (+{len(diffs) - 3} more)" if len(diffs) > 3 else "")) if diffs else ""
    except Exception:  # the report is a courtesy; the ValueError is raised regardless
        return ""
