"""Configuration of the hf_cascade GLIDE draft model (remote-code ready: imports only transformers)."""

from transformers import PretrainedConfig


def _target_rope(config, layer_idx: int) -> dict:
    """The rotary settings of the target's layer ``layer_idx`` as ``{"rope_type", "rope_theta", ...}``.

    Reads transformers 5.x ``rope_parameters`` (flat, or nested by layer type as in Gemma3) and 4.x
    ``rope_theta`` / ``rope_scaling`` (Gemma3 4.x: ``rope_local_base_freq`` for sliding layers)."""
    layer_types = getattr(config, "layer_types", None)
    layer_type = layer_types[layer_idx] if layer_types else "full_attention"
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and layer_type in params and isinstance(params[layer_type], dict):
        params = params[layer_type]
    if isinstance(params, dict) and "rope_theta" in params:
        out = dict(params)
        out.setdefault("rope_type", "default")
        return out
    theta = float(getattr(config, "rope_theta", 10000.0))
    scaling = getattr(config, "rope_scaling", None)
    if layer_type == "sliding_attention" and getattr(config, "rope_local_base_freq", None) is not None:
        theta, scaling = float(config.rope_local_base_freq), None
    out = {"rope_type": "default", "rope_theta": theta}
    if isinstance(scaling, dict):
        out.update({k: v for k, v in scaling.items() if k not in ("type", "rope_theta")})
        out["rope_type"] = scaling.get("rope_type", scaling.get("type", "default"))
    return out


class GlideConfig(PretrainedConfig):
    r"""Configuration of :class:`GlideForCausalLM`, the GLIDE draft model of Du et al. (ICML 2024, "GLIDE with
    a CAPE", Section 4.1): a small Llama-style decoder whose every layer adds, between its self-attention and
    its MLP, a cross-attention over the TARGET's cached keys/values of layer ``l = N_T - N_D + m``.

    Draft backbone:
        hidden_size, intermediate_size, num_hidden_layers (``N_D``), num_attention_heads, num_key_value_heads,
        head_dim, hidden_act, rms_norm_eps, attention_bias, initializer_range, max_position_embeddings.
        rope_theta, rope_config: the rotary embedding of the draft's own self-attention, copied from the
            target (``rope_config`` is ``None`` for plain RoPE or a transformers rope dict without the theta,
            e.g. ``{"rope_type": "linear", "factor": 2.0}``).

    Vocabulary (``share_target_embeddings``):
        False: own embeddings over ``draft_vocab_size`` target ids (the ``vocab_subset`` buffer, FR-Spec
            style as in hf_cascade's drafter head; ``draft_vocab_size == vocab_size`` for a full vocabulary).
        True: the target's input embedding and LM head, attached at run time with
            ``model.tie_to_target(target)`` and never saved (needs ``hidden_size`` = the target's).
        vocab_size: the TARGET's vocabulary size (input ids and full-vocabulary logits).

    Cross-attention (the "glimpse"):
        target_num_attention_heads (``h``), target_head_dim (``d_k``): the queries are ``h`` per-head
            projections of size ``d_k`` of the draft hidden state; ``target_num_key_value_heads``
            (informational; grouped-query K/V are repeated to ``h`` heads at run time).
        target_num_hidden_layers (``N_T``), target_layer_ids: the target layer each draft layer reads;
            ``None`` = the last ``N_D`` layers of the cache handed in (``l = N_T - N_D + m``, as the paper).
        cross_attention_scale: softmax scale (``None`` = ``d_k ** -0.5``; Gemma targets use
            ``query_pre_attn_scalar ** -0.5``).
        cross_rope: per draft layer, the rotary settings (``{"rope_type", "rope_theta", ...}``) applied to the
            cross-attention queries so they match the target's post-rotary keys (``None`` = ``rope_theta`` /
            ``rope_config``).
        block_size: the block length ``L`` of the training mask (Section 4.1; 5 in the paper).
        cross_attention: ``False`` removes the cross-attention sub-layers (no ``cross_attn`` weights; target
            K/V handed to ``forward`` are ignored): the paper's "Vanilla Drafter" of the controlled experiment
            (Section 5.2, Figure 4), the same architecture without the glimpse.

    :meth:`from_target` fills the target fields and rope settings from the target's config.
    """

    model_type = "hf_cascade_glide"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]

    def __init__(
        self,
        vocab_size: int = 32000,
        draft_vocab_size: int | None = None,
        share_target_embeddings: bool = False,
        hidden_size: int = 256,
        intermediate_size: int = 768,
        num_hidden_layers: int = 1,
        num_attention_heads: int = 4,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        hidden_act: str = "silu",
        rms_norm_eps: float = 1e-6,
        attention_bias: bool = False,
        initializer_range: float = 0.02,
        max_position_embeddings: int = 4096,
        rope_theta: float = 10000.0,
        rope_config: dict | None = None,
        target_hidden_size: int | None = None,
        target_num_hidden_layers: int | None = None,
        target_num_attention_heads: int = 32,
        target_num_key_value_heads: int | None = None,
        target_head_dim: int = 128,
        target_layer_ids: list[int] | None = None,
        cross_attention_scale: float | None = None,
        cross_rope: list[dict] | None = None,
        block_size: int = 5,
        cross_attention: bool = True,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        pad_token_id: int | None = None,
        target_name_or_path: str | None = None,
        **kwargs,
    ):
        draft_vocab_size = vocab_size if draft_vocab_size is None else draft_vocab_size
        if share_target_embeddings and draft_vocab_size != vocab_size:
            raise ValueError(
                "share_target_embeddings uses the target's full vocabulary: draft_vocab_size must be vocab_size."
            )
        if not 0 < draft_vocab_size <= vocab_size:
            raise ValueError(f"draft_vocab_size must be in [1, vocab_size={vocab_size}], got {draft_vocab_size}.")
        kv = num_key_value_heads if num_key_value_heads is not None else num_attention_heads
        if num_attention_heads % kv:
            raise ValueError(
                f"num_attention_heads={num_attention_heads} is not a multiple of num_key_value_heads={kv}."
            )
        if target_num_key_value_heads is not None and target_num_attention_heads % target_num_key_value_heads:
            raise ValueError("target_num_attention_heads must be a multiple of target_num_key_value_heads.")
        if target_layer_ids is not None:
            target_layer_ids = [int(i) for i in target_layer_ids]
            if len(target_layer_ids) != num_hidden_layers:
                raise ValueError(
                    f"target_layer_ids needs one target layer per draft layer ({num_hidden_layers}), "
                    f"got {target_layer_ids}."
                )
        if cross_rope is not None:
            cross_rope = [dict(r) for r in cross_rope]
            if len(cross_rope) != num_hidden_layers or any("rope_theta" not in r for r in cross_rope):
                raise ValueError("cross_rope needs one {'rope_type', 'rope_theta', ...} dict per draft layer.")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}.")
        self.vocab_size = vocab_size
        self.draft_vocab_size = draft_vocab_size
        self.share_target_embeddings = bool(share_target_embeddings)
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = kv
        self.head_dim = head_dim if head_dim is not None else hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.rms_norm_eps = rms_norm_eps
        self.attention_bias = attention_bias
        self.initializer_range = initializer_range
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = float(rope_theta)
        self.rope_config = dict(rope_config) if rope_config else None
        self.target_hidden_size = target_hidden_size
        self.target_num_hidden_layers = target_num_hidden_layers
        self.target_num_attention_heads = target_num_attention_heads
        self.target_num_key_value_heads = target_num_key_value_heads
        self.target_head_dim = target_head_dim
        self.target_layer_ids = target_layer_ids
        self.cross_attention_scale = cross_attention_scale
        self.cross_rope = cross_rope
        self.block_size = block_size
        self.cross_attention = bool(cross_attention)
        self.target_name_or_path = target_name_or_path
        kwargs.pop("rope_parameters", None)  # never let transformers 5.x's rope standardisation shadow ours
        kwargs.pop("rope_scaling", None)
        kwargs.pop("tie_word_embeddings", None)  # the head is never tied to the (reduced) input embedding
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=False,
            **kwargs,
        )

    def self_rope(self) -> dict:
        """The rotary settings of the draft's self-attention as ``{"rope_type", "rope_theta", ...}``."""
        out = {"rope_type": "default", **(self.rope_config or {}), "rope_theta": self.rope_theta}
        out.pop("type", None)
        return out

    def resolved_target_layers(self, num_target_layers: int | None = None) -> list[int]:
        """Target layer read by each draft layer: ``target_layer_ids`` or ``l = N_T - N_D + m`` (``m`` from 0)."""
        if self.target_layer_ids is not None:
            return list(self.target_layer_ids)
        n_t = num_target_layers if num_target_layers is not None else self.target_num_hidden_layers
        if n_t is None:
            raise ValueError("target_num_hidden_layers is unknown: pass the target's cache or set target_layer_ids.")
        if n_t < self.num_hidden_layers:
            raise ValueError(f"the target has {n_t} layers, fewer than the draft's {self.num_hidden_layers}.")
        return [n_t - self.num_hidden_layers + m for m in range(self.num_hidden_layers)]

    @classmethod
    def from_target(cls, target_config, **kwargs) -> "GlideConfig":
        """A config for a draft of ``target_config`` (a transformers config or a model): vocabulary, the
        target's attention geometry and layers, its rotary settings (for the draft's self-attention and,
        per read layer, for the cross-attention queries) and its attention scale; ``kwargs`` override
        (draft sizes: ``hidden_size``, ``num_hidden_layers``, ...)."""
        cfg = getattr(target_config, "config", target_config)
        cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        heads = int(cfg.num_attention_heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        n_t = int(cfg.num_hidden_layers)
        n_d = int(kwargs.get("num_hidden_layers", 1))
        layers = kwargs.get("target_layer_ids") or [n_t - n_d + m for m in range(n_d)]
        if any(not 0 <= l < n_t for l in layers):
            raise ValueError(f"target_layer_ids {layers} outside the target's {n_t} layers.")
        global_layer = next(
            (
                l
                for l in reversed(range(n_t))
                if not getattr(cfg, "layer_types", None) or cfg.layer_types[l] == "full_attention"
            ),
            n_t - 1,
        )
        own = _target_rope(cfg, global_layer)
        scalar = getattr(cfg, "query_pre_attn_scalar", None)
        defaults = dict(
            vocab_size=int(cfg.vocab_size),
            num_hidden_layers=n_d,
            max_position_embeddings=int(getattr(cfg, "max_position_embeddings", 4096)),
            rms_norm_eps=float(getattr(cfg, "rms_norm_eps", 1e-6)),
            rope_theta=float(own["rope_theta"]),
            rope_config={k: v for k, v in own.items() if k != "rope_theta"} if own["rope_type"] != "default" else None,
            target_hidden_size=int(cfg.hidden_size),
            target_num_hidden_layers=n_t,
            target_num_attention_heads=heads,
            target_num_key_value_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
            target_head_dim=head_dim,
            target_layer_ids=list(layers),
            cross_attention_scale=float(scalar) ** -0.5 if scalar else None,
            cross_rope=[_target_rope(cfg, l) for l in layers],
            bos_token_id=getattr(cfg, "bos_token_id", None),
            eos_token_id=getattr(cfg, "eos_token_id", None),
            pad_token_id=getattr(cfg, "pad_token_id", None),
            target_name_or_path=getattr(cfg, "_name_or_path", None) or None,
        )
        if kwargs.get("share_target_embeddings"):
            defaults["hidden_size"] = int(cfg.hidden_size)
        defaults.update(kwargs)
        return cls(**defaults)
