"""Convert the authors' released GLIDE checkpoints (``smallLlamaForCausalLM`` / ``smallLlamaConfig`` of
``NonvolatileMemory/GliDe_with_a_CaPE_ICML_24``, ``glide/glideModel.py``; e.g. ``cxdu/glide-vicuna13b``) into
hf_cascade's Hub layout (:class:`GlideForCausalLM` + remote code, via :func:`hf_cascade.heads.hub.save_hub`).

What the reference computes, and how it maps:

* config.json (``smallLlamaConfig``): ``vocab_size``, ``hidden_size``, ``intermediate_size``,
  ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``hidden_act``, ``rms_norm_eps``,
  ``max_position_embeddings``, ``initializer_range``, ``rope_theta``, ``rope_scaling``, ``block_size``,
  ``large_hidden_size``, ``large_num_attention_heads`` (the target's); the cross-attention head size is
  ``large_hidden_size // large_num_attention_heads`` as in ``LlamaCrossAttention`` (``large_head_dim`` is
  stored but unused there). ``pretraining_tp`` only slices matmuls; ``attention_bias`` and ``use_remap``
  create no weights in that code.
* the draft's own embeddings and LM head over the full vocabulary (``draft_vocab_size = vocab_size``; our
  embedding gets one extra, zero "outside the subset" row).
* self-attention rotary: ``rope_theta`` + ``rope_scaling``; cross-attention query rotary: the reference
  builds it without ``rope_theta`` (base 10000) but with ``rope_scaling``; both are kept exactly
  (``cross_rope``). ``dynamic`` scaling is transformers' variant, not the reference's cached one.
* target layers: the reference reads ``large_layers - N_D + m`` of whatever cache it is given; so does our
  ``target_layer_ids=None``.

Weight names are the same: ``model.embed_tokens.weight``, ``model.layers.{m}.{input_layernorm,
post_attention_layernorm}.weight``, ``model.layers.{m}.self_attn.{q,k,v,o}_proj.weight``,
``model.layers.{m}.cross_attn.{q,o}_proj.weight``, ``model.layers.{m}.mlp.{gate,up,down}_proj.weight``,
``model.norm.weight``, ``lm_head.weight`` (a ``small_model.`` prefix from ``JointModel`` is stripped).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch

from ..hub import save_hub
from .configuration_glide import GlideConfig
from .modeling_glide import GlideForCausalLM

_IGNORED = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


def _read_weights(src: Path) -> dict[str, torch.Tensor]:
    files = sorted(src.glob("*.safetensors")) or sorted(src.glob("pytorch_model*.bin")) or sorted(src.glob("*.pt"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors / pytorch_model*.bin weights in {src}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        if f.suffix == ".safetensors":
            from safetensors.torch import load_file

            state.update(load_file(str(f)))
        else:
            state.update(torch.load(str(f), map_location="cpu", weights_only=True))
    return state


def reference_config_to_glide(ref: dict, **overrides) -> GlideConfig:
    """A :class:`GlideConfig` equivalent to the reference ``smallLlamaConfig`` dict ``ref``."""
    if ref.get("use_remap"):
        warnings.warn("use_remap=True: the reference creates no remap weights; ignored.", stacklevel=2)
    heads = int(ref.get("num_attention_heads", 32))
    hidden = int(ref.get("hidden_size", 4096))
    large_heads = int(ref.get("large_num_attention_heads", 32))
    large_hidden = int(ref.get("large_hidden_size", 4096))
    scaling = ref.get("rope_scaling")
    rope_config = None
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind not in ("linear", "dynamic"):
            raise ValueError(f"unsupported rope_scaling {scaling} (the reference knows linear and dynamic)")
        rope_config = {"rope_type": kind, "factor": float(scaling["factor"])}
    cross = {"rope_type": "default", "rope_theta": 10000.0, **(rope_config or {})}
    n_layers = int(ref.get("num_hidden_layers", 32))
    vocab = int(ref.get("vocab_size", 32000))
    kw = dict(
        vocab_size=vocab,
        draft_vocab_size=vocab,
        share_target_embeddings=False,
        hidden_size=hidden,
        intermediate_size=int(ref.get("intermediate_size", 11008)),
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=int(ref.get("num_key_value_heads") or heads),
        head_dim=hidden // heads,
        hidden_act=ref.get("hidden_act", "silu"),
        rms_norm_eps=float(ref.get("rms_norm_eps", 1e-6)),
        attention_bias=False,
        initializer_range=float(ref.get("initializer_range", 0.02)),
        max_position_embeddings=int(ref.get("max_position_embeddings", 2048)),
        rope_theta=float(ref.get("rope_theta", 10000.0)),
        rope_config=rope_config,
        target_hidden_size=large_hidden,
        target_num_attention_heads=large_heads,
        target_head_dim=large_hidden // large_heads,
        target_layer_ids=None,
        cross_rope=[dict(cross) for _ in range(n_layers)],
        block_size=int(ref.get("block_size") or 5),
        bos_token_id=ref.get("bos_token_id", 1),
        eos_token_id=ref.get("eos_token_id", 2),
        pad_token_id=ref.get("pad_token_id"),
        target_name_or_path=ref.get("_name_or_path") or None,
    )
    kw.update(overrides)
    return GlideConfig(**kw)


def convert_reference_checkpoint(
    src_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    card: str | dict = "",
    dtype: torch.dtype | None = None,
    **config_overrides,
) -> GlideForCausalLM:
    """Read the authors' checkpoint directory ``src_dir`` (config.json + safetensors / ``pytorch_model*.bin``),
    build the equivalent :class:`GlideForCausalLM` (strictly: every tensor must be used and have the expected
    shape, else ``ValueError``), save it to ``out_dir`` with :func:`save_hub` and return it. ``dtype`` defaults
    to the checkpoint's; ``config_overrides`` (e.g. ``target_name_or_path``, ``target_num_key_value_heads``)
    go to the config."""
    src = Path(src_dir)
    ref = json.loads((src / "config.json").read_text())
    config = reference_config_to_glide(ref, **config_overrides)
    state = {k.removeprefix("small_model."): v for k, v in _read_weights(src).items() if not k.endswith(_IGNORED)}
    if dtype is None:
        dtype = next((v.dtype for v in state.values() if v.is_floating_point()), torch.float32)
    model = GlideForCausalLM(config)
    emb = state.get("model.embed_tokens.weight")
    if emb is not None and emb.shape == (config.vocab_size, config.hidden_size):
        state["model.embed_tokens.weight"] = torch.cat([emb, emb.new_zeros(1, emb.shape[1])])  # + OOV row
    expected = {k: v.shape for k, v in model.state_dict().items() if k != "vocab_subset"}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(k for k in set(expected) & set(state) if tuple(state[k].shape) != tuple(expected[k]))
    if missing or unexpected or wrong:
        detail = "; ".join(
            f"{name}: {keys[:5]}"
            for name, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong))
            if keys
        )
        raise ValueError(f"{src} does not match its smallLlamaConfig ({detail}).")
    state["vocab_subset"] = torch.arange(config.vocab_size, dtype=torch.long)
    model.load_state_dict(state, strict=True)
    model = model.to(dtype).eval()
    meta = dict(card) if isinstance(card, dict) else {"body": card}
    meta.setdefault(
        "body",
        f"# GLIDE draft model\n\nConverted from the reference checkpoint `{src.name}` "
        '(Du et al., ICML 2024, "GLIDE with a CAPE") to hf_cascade\'s layout.',
    )
    save_hub(model, out_dir, meta)
    return model
