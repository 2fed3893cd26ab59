"""Convert a checkpoint of Apple's reference ReDrafter (``apple/ml-recurrent-drafter``) to hf_cascade's
Hub layout.

The reference trainer ends with ``Drafter.save_pretrained(output_dir)``: a directory with
``config.json`` (``model_type: "recurrent_drafting_drafter"``, ``architectures: ["Drafter"]``, fields
``vocab_size``, ``hidden_size``, ``exit_dim``, ``num_draft_layers``, ``num_lookback_tokens``, ``rnn``;
the MLX port adds ``emb_norm`` / ``rms_norm_eps``) and ``model.safetensors`` (or, from older
transformers or ``safe_serialization=False``, ``pytorch_model.bin``; either may be sharded with an
``*.index.json``). Its tensor names are ours, so the state dict loads with ``strict=True``.

Not part of the remote code (it imports hf_cascade).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..hub import save_hub
from .configuration_redrafter import ReDrafterConfig
from .modeling_redrafter import ReDrafterModel

REFERENCE_MODEL_TYPE = "recurrent_drafting_drafter"
#: config.json fields of the reference (DrafterConfig + the MLX ModelArgs extras) carried over as is.
REFERENCE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "exit_dim",
    "num_draft_layers",
    "num_lookback_tokens",
    "rnn",
    "emb_norm",
    "rms_norm_eps",
)
#: The reference's own defaults where its config.json omits a field (DrafterConfig.__init__).
REFERENCE_DEFAULTS = {"num_lookback_tokens": -1, "rnn": False, "emb_norm": False, "rms_norm_eps": 1e-5}


def reference_config(src_dir: str | os.PathLike, **overrides) -> ReDrafterConfig:
    """A :class:`ReDrafterConfig` from the reference's config.json in ``src_dir``."""
    raw = json.loads((Path(src_dir) / "config.json").read_text())
    model_type = raw.get("model_type")
    if model_type not in (None, REFERENCE_MODEL_TYPE):
        raise ValueError(
            f"{src_dir}/config.json has model_type {model_type!r}, not the reference "
            f"ReDrafter's {REFERENCE_MODEL_TYPE!r}."
        )
    missing = [k for k in ("vocab_size", "hidden_size", "exit_dim", "num_draft_layers") if int(raw.get(k, -1)) <= 0]
    if missing:
        raise ValueError(f"{src_dir}/config.json lacks (or leaves at -1) required fields {missing}.")
    fields = {k: raw.get(k, REFERENCE_DEFAULTS.get(k)) for k in REFERENCE_FIELDS}
    fields.update(overrides)
    return ReDrafterConfig(**fields)


def read_reference_state_dict(src_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    """All tensors of the reference checkpoint in ``src_dir`` (safetensors or pickle, sharded or not).

    A state dict saved from the reference's training wrapper (``ReDrafter(llm, drafter)``) has its
    head under ``drafter.``: that prefix is stripped and the target's (``llm.``) tensors dropped."""
    src = Path(src_dir)
    files: list[Path] = []
    for single, index in (
        ("model.safetensors", "model.safetensors.index.json"),
        ("pytorch_model.bin", "pytorch_model.bin.index.json"),
    ):
        if (src / single).is_file():
            files = [src / single]
        elif (src / index).is_file():
            weight_map = json.loads((src / index).read_text())["weight_map"]
            files = [src / name for name in sorted(set(weight_map.values()))]
        if files:
            break
    if not files:
        raise FileNotFoundError(f"No model.safetensors / pytorch_model.bin (or sharded index) in {src}.")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        if f.suffix == ".safetensors":
            from safetensors.torch import load_file

            state.update(load_file(str(f)))
        else:
            state.update(torch.load(f, map_location="cpu", weights_only=True))
    if any(k.startswith("drafter.") for k in state):
        state = {k[len("drafter.") :]: v for k, v in state.items() if k.startswith("drafter.")}
    return state


def convert_reference_checkpoint(
    src_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    target_name_or_path: str | None = None,
    dtype: torch.dtype | None = None,
    card: str | dict | None = None,
) -> Path:
    """Read a reference ReDrafter checkpoint from ``src_dir`` and save it to ``out_dir`` in hf_cascade's
    Hub layout (:func:`hf_cascade.heads.hub.save_hub`: safetensors + config.json with ``auto_map`` +
    remote code + model card). The full-vocabulary layout is kept (``draft_vocab_size=None``).

    ``dtype``: of the saved weights; default the checkpoint's own floating dtype. Raises ``ValueError``
    when the tensors do not match the config (missing, unexpected or wrong-shaped). Returns ``out_dir``."""
    config = reference_config(src_dir, target_name_or_path=target_name_or_path)
    state = read_reference_state_dict(src_dir)
    model = ReDrafterModel(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items()}
    if expected != got:
        missing = sorted(set(expected) - set(got))
        unexpected = sorted(set(got) - set(expected))
        shapes = [
            f"{k} ckpt {list(got[k])} vs config {list(expected[k])}"
            for k in sorted(set(got) & set(expected))
            if got[k] != expected[k]
        ]
        raise ValueError(
            f"{src_dir} does not match its config.json: missing {missing}, unexpected {unexpected}, "
            f"wrong shapes {shapes}."
        )
    model.load_state_dict(state, strict=True)
    if dtype is None:
        floats = {v.dtype for v in state.values() if v.is_floating_point()}
        dtype = floats.pop() if len(floats) == 1 else torch.float32
    model.to(dtype).eval()
    if card is None:
        card = {
            "body": '# ReDrafter head\n\nA recurrent draft head (Cheng et al., 2024, "Recurrent Drafter for '
            'Fast Speculative Decoding in Large Language Models"), converted from the reference '
            "implementation's checkpoint (apple/ml-recurrent-drafter) by hf_cascade.\n"
        }
    return save_hub(model, out_dir, card)


__all__ = ["REFERENCE_FIELDS", "convert_reference_checkpoint", "read_reference_state_dict", "reference_config"]
