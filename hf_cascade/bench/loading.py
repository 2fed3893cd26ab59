"""Load what a benchmark or the demo needs: target, draft models, prompts.

A model spec is ``None``/``"default"`` (the embedded Gemma-3-270M), ``"smollm2"``, a local Hugging Face
directory (a drafter saved by ``hf-cascade train`` included), a Hub repo id (``org/name``, resolved through
the Hub cache like :func:`hf_cascade.load_pretrained`: heads by hf_cascade's own classes), or ``gguf:PATH``
(converted once into a cached safetensors directory). A draft spec may also be ``self:N``: the target's
first ``N`` layers. A target loads in float32 on the CPU unless told otherwise (:func:`target_placement`: the
benchmark's ``--dtype``, ``--device`` / ``--device-map`` and ``--attn-implementation``); a causal-LM draft loads in
the target's dtype on its input device (transformers' assisted generation needs its draft there; hf_cascade's
heads follow the target at each call anyway).

Shipped heads (:func:`draft_specs`): a strategy given no draft model, measured on the default target, takes
the head shipped for it (:data:`SHIPPED_HEADS`): the folder of ``model_cards/`` in a source checkout
(:func:`hf_cascade.shipped`; nothing is published on the Hub). Any other target, or an install without the
folders (a wheel), gets none: the strategy is then unavailable unless ``--draft`` names one.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from .. import models

#: The heads shipped for the default target (folders of ``model_cards/``),
#: per strategy: what ``hf-cascade bench --strategy NAME`` measures when no ``--draft`` is given.
SHIPPED_HEADS = {
    "cascade": ["gemma-3-270m-drafter-xs"],
    "hsddw": ["gemma-3-270m-drafter-xs"],
    "glide": ["gemma-3-270m-glide-xs"],
    "redrafter": ["gemma-3-270m-redrafter-xs"],
}
#: Where a source checkout keeps them (absent from an installed wheel).
MODEL_CARDS = Path(__file__).resolve().parents[2] / "model_cards"


def is_default_target(spec: str | None) -> bool:
    """Whether a target spec names the embedded Gemma-3-270M (``None``, ``"default"``, ``"gemma-3-270m"``)."""
    return spec is None or spec in ("default", models.DEFAULT_TARGET)


def shipped_head(folder: str) -> str | None:
    """A shipped head: its local ``model_cards/`` directory, or ``None`` where this install has none."""
    local = MODEL_CARDS / folder
    return str(local) if (local / "config.json").is_file() else None


def draft_specs(config) -> dict[str, list[str]]:
    """Draft specs of every strategy a :class:`~hf_cascade.bench.config.BenchConfig` measures (its own
    ``strategy_drafts`` and those of the strategies its baselines vary), by precedence: the strategy's own
    (``--draft NAME=PATH``), else the shared ``drafts`` (``--draft PATH``), else, on the default target,
    :data:`SHIPPED_HEADS`; a strategy left with none is missing from the result."""
    out: dict[str, list[str]] = {}
    for family in config.draft_families:
        specs = config.drafts_of(family)
        if not specs and is_default_target(config.target) and family in SHIPPED_HEADS:
            specs = [h for h in map(shipped_head, SHIPPED_HEADS[family]) if h is not None]
        if specs:
            out[family] = specs
    return out


def target_placement(config) -> dict:
    """:func:`load_model`'s placement of a :class:`~hf_cascade.bench.config.BenchConfig`'s target: its dtype, its
    ``device_map`` (else the whole model on its device; on the CPU none, as ``from_pretrained`` loads there) and its
    attention implementation."""
    import torch

    device_map = config.device_map
    if device_map is None and torch.device(config.device).type != "cpu":
        device_map = config.device
    return {
        "dtype": getattr(torch, config.dtype),
        "device_map": device_map,
        "attn_implementation": config.attn_implementation,
    }


def load_model(
    spec: str | None,
    device_map=None,
    max_memory: dict | None = None,
    dtype=None,
    attn_implementation: str | None = None,
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for a spec (see the module docstring); the model in eval mode. ``device_map``
    (``from_pretrained``'s: ``"auto"``, ``"cuda:0"``, a dict, ...) places a target across devices, within ``max_memory``
    per device where given; ``None``: the CPU. ``dtype``: a torch dtype (``None``: float32). ``attn_implementation``:
    the attention the model runs (``None``: transformers' default); not for hf_cascade's heads."""
    model, tokenizer = _load(spec, dtype=dtype, device_map=device_map, max_memory=max_memory)
    if attn_implementation is not None:
        if tokenizer is None:
            raise ValueError(f"{spec}: an hf_cascade head has no attention implementation to set")
        if not hasattr(model, "set_attn_implementation"):
            raise ValueError(
                "--attn-implementation needs a transformers release with set_attn_implementation (4.56 or later)"
            )
        model.set_attn_implementation(attn_implementation)
    return model, tokenizer


def _load(spec: str | None, dtype=None, device_map=None, max_memory: dict | None = None) -> tuple[Any, Any]:
    """:func:`load_model` less the attention implementation."""
    import torch

    placed = {"dtype": dtype or torch.float32, "device_map": device_map, "max_memory": max_memory}
    if spec is None or spec in ("default", models.DEFAULT_TARGET):
        return models.load_default_target(**placed)
    if spec in ("smollm2", models.SMOLLM2):
        return models.load_smollm2(**placed)
    if spec.startswith("gguf:"):
        path = Path(spec[len("gguf:") :]).expanduser().resolve()
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {path}")
        key = hashlib.sha1(str(path).encode()).hexdigest()[:10]
        hf_dir = models.gguf_to_hf_dir(path, models.cache_dir() / "gguf_hf" / f"{path.stem}-{key}")
        return models.load_hf_dir(hf_dir, **placed)
    path = Path(spec).expanduser()
    if not path.is_dir():
        return _load_repo(spec, **placed)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{path} holds no model (no config.json): a model card without weights? Use "
            "'default', 'smollm2', a model directory, a Hub repo id or gguf:PATH."
        )
    if _is_hf_cascade_head(path):
        from ..loading import load_head

        return load_head(path).eval(), None
    return models.load_hf_dir(path, **placed)


def _load_repo(spec: str, dtype, device_map=None, max_memory: dict | None = None) -> tuple[Any, Any]:
    """A Hub repo id: the model through :func:`hf_cascade.load_pretrained`, the tokenizer (none for heads)."""
    from ..loading import load_pretrained

    try:
        model = load_pretrained(spec, dtype=dtype, device_map=device_map, max_memory=max_memory, kind="model")
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e} Use 'default', 'smollm2', a directory, a Hub repo id or gguf:PATH.") from e
    if str(model.config.model_type).startswith("hf_cascade_"):
        return model.eval(), None
    from transformers import AutoTokenizer

    return model.eval(), AutoTokenizer.from_pretrained(spec)


def _is_hf_cascade_head(path: Path) -> bool:
    """A checkpoint written by ``hf-cascade train`` (no tokenizer of its own: it uses the target's)."""
    import json

    config = path / "config.json"
    return config.is_file() and str(json.loads(config.read_text()).get("model_type", "")).startswith("hf_cascade_")


def load_drafts(specs: list[str], target: Any = None) -> list[Any]:
    """Draft models (largest first), each loaded with :func:`load_model` (given the ``target``: a causal LM in its
    dtype on its input device, a head as it is saved); ``self:N`` is the target's own first ``N`` layers with its
    head (:func:`~hf_cascade.drafters.self_draft.first_layers_drafter`)."""
    from ..drafters.self_draft import first_layers_drafter
    from ..placement import target_device_dtype

    placed = {}
    if target is not None:
        device, dtype = target_device_dtype(target)
        placed = {"dtype": dtype, "device_map": None if device.type == "cpu" else str(device)}
    drafts = []
    for spec in specs:
        if spec.startswith("self:"):
            if target is None:
                raise ValueError("a self:N draft needs the target model")
            drafts.append(first_layers_drafter(target, int(spec[len("self:") :])))
        else:
            drafts.append(load_model(spec, **placed)[0])
    return drafts


def load_draft_sets(
    shared: list[str], specs: dict[str, list[str]], target: Any = None
) -> tuple[list[Any], dict[str, list[Any]]]:
    """``(shared drafts, {strategy: drafts})``, each spec loaded with :func:`load_drafts`; a spec named more
    than once (shared and by strategies, or by several strategies) loads once and its users share the model,
    as the methods of one run always have shared ``--draft``."""
    loaded: dict[str, Any] = {}
    for spec in dict.fromkeys([*shared, *(s for group in specs.values() for s in group)]):
        loaded[spec] = load_drafts([spec], target=target)[0]
    return [loaded[s] for s in shared], {family: [loaded[s] for s in group] for family, group in specs.items()}


def load_prompts(
    path: str | None, per_category: int, tokenizer: Any = None, prompt_format: str = "plain"
) -> list[dict]:
    """Spec-Bench prompts, the first ``per_category`` of each category, as dicts with ``category`` and
    the formatted ``prompt`` text (see :func:`hf_cascade.data.load_specbench`); with ``prompt_format="chat"`` the
    first turn goes through ``tokenizer``'s chat template instead: ``input_ids`` (what is run) and its ``prompt``
    text (what is recorded)."""
    from .. import data

    items = data.load_specbench(path, per_category=per_category)
    if not items:
        raise ValueError(f"no prompts found in {path or 'Spec-Bench'}")
    if prompt_format == "chat":
        for item in items:
            item["input_ids"] = data.chat_prompt_ids(tokenizer, [{"role": "user", "content": item["turns"][0].strip()}])
            item["prompt"] = tokenizer.decode(item["input_ids"])
    return items
