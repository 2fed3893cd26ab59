"""GLIDE, the "glimpse" draft model of Du et al. (ICML 2024, "GLIDE with a CAPE: A Low-Hassle Method to
Accelerate Speculative Decoding", Section 4.1, Appendices B and F).

A small Llama-style decoder (usually a single layer, Appendix F) whose every layer ``m`` inserts a
cross-attention sub-layer between its causal self-attention and its MLP. The cross-attention's queries are
``h`` per-head projections ``Q^{m,j} = H^m W_j`` (``W_j`` in ``R^{d_D x d_k}``) of the draft's hidden state
onto the TARGET's head size ``d_k`` and number of query heads ``h``; its keys and values are the target's
cached ``K^l, V^l`` of layer ``l = N_T - N_D + m`` (post-rotary, as stored in the target's KV cache, so the
queries get the target's rotary embedding at their own positions; grouped-query K/V are repeated to ``h``
heads); ``W^O`` projects the ``h * d_k`` concatenation back to ``d_D``. As in the authors' code
(``NonvolatileMemory/GliDe_with_a_CaPE_ICML_24``, ``glide/glideModel.py``) the cross-attention reads the
residual stream after self-attention without a norm and adds to it; weight names follow that code
(``model.layers.{m}.cross_attn.{q,o}_proj.weight`` etc.).

Cross-attention masks:

* training -- the block-wise mask of Section 4.1 (:func:`glide_cross_mask`): sequences are cut into blocks of
  ``L = 5`` tokens and a draft position in block ``b`` sees only target positions of blocks ``< b``,
  simulating at training time the "KV cache delay" of decoding;
* decoding (``cross_attention_mask=None``) -- a draft query at sequence index ``i`` sees the target cache
  entries ``k < i``: every query beyond the last verified token (``i >= S``, ``S`` = target cache length)
  sees the whole cache, as in the paper; tokens re-read inside the cache see only earlier entries.

Remote-code ready: imports only torch, transformers and its sibling files (``configuration_glide.py``, and
``attention_glide.py`` with the attention sub-layers and the cross-attention masks, which ``save_pretrained``
copies as a relative import), so a checkpoint saved with ``save_pretrained`` loads with
``AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)``.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .attention_glide import (
    GlideCrossAttention,
    GlideMLP,
    GlideRMSNorm,
    GlideSelfAttention,
    _as_weight,
    _device_of,
    _like_weight,
    _rotary,
    cross_allowed,
    glide_cross_mask,  # noqa: F401  (re-exported: the heads' package and remote code import it from here)
    rope_tables,
)
from .configuration_glide import GlideConfig

# transformers 5.24 renamed the output field past_key_values -> cache (the old name warns)
_OUTPUT_CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class GlideDecoderLayer(nn.Module):
    """norm -> self-attention -> +residual -> cross-attention (no norm, as the reference) -> +residual ->
    norm -> MLP -> +residual."""

    def __init__(self, config: GlideConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = GlideRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = GlideSelfAttention(config, layer_idx)
        # ``cross_attention=False``: the paper's Vanilla Drafter baseline (Section 5.2), no glimpse sub-layer
        self.cross_attn = GlideCrossAttention(config, layer_idx) if config.cross_attention else None
        self.post_attention_layernorm = GlideRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GlideMLP(config)

    def forward(self, x, rope, self_allowed, position_ids, cache=None, target_kv=None, cross_allowed=None):
        """``rope``: the self-attention's ``rope_tables`` at ``position_ids``. Masks: bool, True = may attend;
        ``None``: every key / target entry."""
        x = x + self.self_attn(self.input_layernorm(x), rope, self_allowed, cache)
        if target_kv is not None and self.cross_attn is not None:
            shared = rope if self.cross_attn.self_rope else None
            x = x + self.cross_attn(x, position_ids, target_kv[0], target_kv[1], cross_allowed, shared)
        return x + self.mlp(self.post_attention_layernorm(x))


class GlideModel(nn.Module):
    """The decoder stack: ``embed_tokens`` (own vocabulary only), ``layers``, ``norm``, ``rotary_emb``."""

    def __init__(self, config: GlideConfig):
        super().__init__()
        if not config.share_target_embeddings:
            # row N: "target id outside the subset"
            self.embed_tokens = nn.Embedding(config.draft_vocab_size + 1, config.hidden_size)
        self.layers = nn.ModuleList([GlideDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = GlideRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = _rotary(config.self_rope(), config.head_dim, config.max_position_embeddings)


def _cache_layers(cache) -> list:
    """Per-layer ``(k, v)`` of a transformers Cache (4.57 / 5.x) or a legacy tuple of pairs."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    if hasattr(cache, "key_cache"):
        return list(zip(cache.key_cache, cache.value_cache))
    return [(kv[0], kv[1]) for kv in cache]


def _static_columns(cache) -> int | None:
    """The columns of a static cache (fixed buffers written at its length, as transformers' ``StaticLayer``), which
    self-attention then spans (the mask hides the columns past each query); ``None`` for any other cache."""
    layers = getattr(cache, "layers", None)
    if not layers or not all(getattr(layer, "is_compileable", False) for layer in layers):
        return None
    return max(int(layer.max_cache_len) for layer in layers)


class GlideForCausalLM(PreTrainedModel, GenerationMixin):
    """The GLIDE draft model (see the module docstring). Target ids in; logits over the target's vocabulary out
    (``finfo.min`` outside ``vocab_subset`` with a reduced own vocabulary).

    Buffers: ``vocab_subset`` ``[N]`` (own vocabulary only; sorted target ids, draft id ``i`` = target id
    ``vocab_subset[i]``). With ``share_target_embeddings`` call :meth:`tie_to_target` before running."""

    config_class = GlideConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _no_split_modules = ["GlideDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values", "cache"]
    _supports_cache_class = True
    _supports_sdpa = False
    _supports_flash_attn = False

    def __init__(self, config: GlideConfig):
        super().__init__(config)
        self.model = GlideModel(config)
        self._target_io = None  # (input embedding, LM head) of the target: plain attribute, never saved
        # settings that decide the module tree (read once: a config attribute read costs a call per forward)
        self._shared, self._cross = bool(config.share_target_embeddings), bool(config.cross_attention)
        if not config.share_target_embeddings:
            n = config.draft_vocab_size
            self.lm_head = nn.Linear(config.hidden_size, n, bias=False)
            self.register_buffer("vocab_subset", torch.arange(n, dtype=torch.long), persistent=True)  # [N]
        # the self-attention's rotary tables of one query, per host position, where they do not change with the
        # sequence length (not "dynamic" / "longrope" scaling): the same values, computed once (a plain dict, never
        # saved)
        self._rope_at: dict | None = {} if config.self_rope().get("rope_type") not in ("dynamic", "longrope") else None
        self._at: dict = {}  # one query's index tensors per host position (_positions)
        self.post_init()

    # -- target -------------------------------------------------------------------------------------
    def tie_to_target(self, target) -> "GlideForCausalLM":
        """Check ``target``'s geometry against the config and, with ``share_target_embeddings``, borrow its
        input embedding and LM head (held outside the module tree: not saved, not trained)."""
        tc = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
        c = self.config
        heads = int(tc.num_attention_heads)
        head_dim = int(getattr(tc, "head_dim", None) or tc.hidden_size // heads)
        if (heads, head_dim) != (c.target_num_attention_heads, c.target_head_dim):
            raise ValueError(
                f"target has {heads} heads of size {head_dim}; this GLIDE expects "
                f"{c.target_num_attention_heads} of size {c.target_head_dim}."
            )
        if int(tc.vocab_size) != c.vocab_size:
            raise ValueError(f"target vocab_size {tc.vocab_size} != config.vocab_size {c.vocab_size}.")
        c.resolved_target_layers(int(tc.num_hidden_layers))  # raises if the target is too shallow
        if any(l >= int(tc.num_hidden_layers) for l in c.resolved_target_layers(int(tc.num_hidden_layers))):
            raise ValueError(
                f"target_layer_ids {c.target_layer_ids} outside the target's {tc.num_hidden_layers} layers."
            )
        if c.share_target_embeddings:
            if int(tc.hidden_size) != c.hidden_size:
                raise ValueError(
                    f"sharing the target's embeddings needs hidden_size {tc.hidden_size}, got {c.hidden_size}."
                )
            self._target_io = (target.get_input_embeddings(), target.get_output_embeddings())
        return self

    def target_kv(self, past_key_values) -> list:
        """The ``(k, v)`` pairs the draft layers read (``[B, kv_heads, S, head_dim]`` each) from a target's cache
        (a transformers Cache or a tuple of per-layer pairs over all target layers)."""
        layers = _cache_layers(past_key_values)
        return [layers[l] for l in self.config.resolved_target_layers(len(layers))]

    def glimpse(self, past_key_values) -> list:
        """:meth:`target_kv` as the cross-attention layers read them (on each layer's device, in its dtype, repeated
        to the query heads: ``[B, h, S, d_k]``), so that a forward given them copies nothing of the target's cache;
        for several forwards over one cache (a draft's steps). Pairs of an offloaded layer (weights on ``meta``)
        are left as they are (its forward moves them)."""
        pairs = self.target_kv(past_key_values)
        if not self._cross:
            return pairs
        return [
            pair if layer.cross_attn.q_proj.weight.device.type == "meta" else layer.cross_attn.read_target(*pair)
            for layer, pair in zip(self.model.layers, pairs)
        ]

    # -- vocabulary ---------------------------------------------------------------------------------
    @torch.no_grad()
    def set_vocab_subset(self, ids) -> None:
        """Set the ``N`` target ids the draft predicts (sorted, unique, in ``[0, vocab_size)``)."""
        if self.config.share_target_embeddings:
            raise ValueError("a draft sharing the target's embeddings has no vocabulary subset.")
        ids = torch.as_tensor(ids, dtype=torch.long).flatten().cpu()
        n, v = self.config.draft_vocab_size, self.config.vocab_size
        if ids.numel() != n:
            raise ValueError(f"vocab_subset must hold draft_vocab_size={n} ids, got {ids.numel()}.")
        if n > 1 and not bool((ids[1:] > ids[:-1]).all()):
            raise ValueError("vocab_subset must be sorted ascending without duplicates.")
        if int(ids[0]) < 0 or int(ids[-1]) >= v:
            raise ValueError(f"vocab_subset ids must lie in [0, {v}), got [{int(ids[0])}, {int(ids[-1])}].")
        self.vocab_subset.copy_(ids.to(self.vocab_subset.device))

    def to_draft_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Target ids (any shape) -> draft ids in ``[0, N]`` (``N`` = outside the subset). Identity when sharing."""
        if self._shared:
            return input_ids
        subset = self.vocab_subset
        ids = input_ids.to(subset.device)
        pos = torch.searchsorted(subset, ids.contiguous()).clamp_max(subset.numel() - 1)
        return torch.where(subset[pos] == ids, pos, torch.full_like(pos, subset.numel()))

    def _io(self):
        if not self._shared:
            return self.model.embed_tokens, self.lm_head
        if self._target_io is None:
            raise RuntimeError("this GLIDE shares the target's embeddings: call model.tie_to_target(target) first.")
        return self._target_io

    def get_input_embeddings(self):
        if self.config.share_target_embeddings:
            return None if self._target_io is None else self._target_io[0]
        return self.model.embed_tokens

    def set_input_embeddings(self, value) -> None:
        if self.config.share_target_embeddings:
            raise ValueError("the embeddings are the target's: use tie_to_target.")
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        if self.config.share_target_embeddings:
            return None if self._target_io is None else self._target_io[1]
        return self.lm_head

    def set_output_embeddings(self, value) -> None:
        if self.config.share_target_embeddings:
            raise ValueError("the LM head is the target's: use tie_to_target.")
        self.lm_head = value

    # -- forward ------------------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values=None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        target_key_values=None,
        cross_attention_mask: torch.Tensor | None = None,
        self_attention_mask: torch.Tensor | None = None,
        full_vocab: bool = True,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast | tuple:
        """Args (``B`` batch, ``T`` new tokens, ``P`` cached draft tokens, ``S`` target cache length):
            input_ids: ``[B, T]`` TARGET ids (or ``inputs_embeds`` ``[B, T, H]``).
            attention_mask: ``[B, P + T]`` 1/0 padding mask (its first ``S`` columns also mask target entries).
            past_key_values: the draft's own self-attention ``DynamicCache`` (created when ``use_cache``), or a
                static cache (fixed buffers: attention spans them all, the mask hiding what is past each query).
            target_key_values: the target's cached K/V (ignored when ``config.cross_attention`` is False): a list
                of ``N_D`` pairs ``(k, v)``, one per draft layer, each ``[B, kv_heads_T, S, d_k]`` post-rotary; or the
                target's whole cache (a transformers Cache or per-layer pairs), from which layers ``l = N_T - N_D + m``
                are taken. ``None``: no cross-attention.
            cross_attention_mask: bool, True = may attend, ``[T, S]``, ``[B, T, S]`` or ``[B, 1|h, T, S]``
                (training: :func:`glide_cross_mask`); ``None`` = query at sequence index ``i`` sees entries ``< i``.
            self_attention_mask: bool, True = may attend, ``[T, P + T]`` or ``[B, 1, T, P + T]``, in place of the causal
                mask (padding still applies; training's unrolled drafts, ``hf_cascade.training.glide``).
            labels: ``[B, T]`` target ids, shifted inside (-100 and ids outside the subset ignored).
            full_vocab: ``[B, T', V]`` logits (``finfo.min`` outside the subset) or ``[B, T', N]``.
            return_dict: ``False``: the output's fields that are set, as a tuple (``(logits, cache)`` for a
                cached forward without labels), as ``ModelOutput.to_tuple`` gives them.
        Returns ``CausalLMOutputWithPast`` (``past_key_values`` = the draft's own cache)."""
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        past_key_values = kwargs.pop("cache", past_key_values)  # transformers >= 5.24's name for it
        cache_position = kwargs.pop("cache_position", None)  # optional ``[T]`` sequence indices of the new tokens
        embed, head = self._io()
        if inputs_embeds is None:
            ids = self.to_draft_ids(input_ids)
            where = _device_of(embed, input_ids)
            inputs_embeds = embed(ids if ids.device == where else ids.to(where))  # [B, T, H]
        # shared embeddings are the target's (its device and dtype): run the layers where and as they are
        norm_weight = self.model.norm.weight
        inputs_embeds = _as_weight(inputs_embeds, norm_weight.device, norm_weight.dtype)
        b, t, _ = inputs_embeds.shape
        device = inputs_embeds.device
        if use_cache is None:
            use_cache = past_key_values is not None
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()
        width = _static_columns(past_key_values)  # a static cache: attention over its fixed buffers
        first = at = None  # the first query's sequence index, when a host count;
        if width is None:  # at: that of one query, its positions made once
            past = past_key_values.get_seq_length() if past_key_values is not None else 0
            width = past + t
            if cache_position is None:
                first = past
                if position_ids is None and b == t == 1:
                    at = past
                    cache_position, position_ids = self._positions(past, device)  # [1], [1, 1]
                else:
                    cache_position = torch.arange(past, past + t, device=device)  # [T]
        elif cache_position is None:  # the static cache's length, as a tensor
            cache_position = torch.arange(t, device=device) + past_key_values.get_seq_length()
        if position_ids is None:
            position_ids = cache_position[None].expand(b, t)  # [B, T]

        # self-attention: key j visible to query i iff j <= cache_position[i] and not padding
        keys = self_allowed = None  # None: one query after every key, which sees them all
        if attention_mask is not None or first is None or t > 1:
            keys = torch.arange(width, device=device)
            self_allowed = (keys[None, :] <= cache_position[:, None])[None, None]  # [1, 1, T, P+T]
            if self_attention_mask is not None:
                given = self_attention_mask.to(device=device, dtype=torch.bool)
                self_allowed = given[None, None] if given.dim() == 2 else given
        if attention_mask is not None:
            if attention_mask.dim() != 2:
                raise ValueError("attention_mask must be a [B, P + T] padding mask.")
            pad = attention_mask[:, -width:].bool().to(device)  # [B, P+T]
            self_allowed = self_allowed & pad[:, None, None, :]
            self_allowed = (
                self_allowed | (keys[None, :] == cache_position[:, None])[None, None]
            )  # padded rows: self only

        kv_pairs = None
        if target_key_values is not None and self._cross:
            kv_pairs = target_key_values
            if not (isinstance(kv_pairs, (list, tuple)) and len(kv_pairs) == len(self.model.layers)):
                kv_pairs = self.target_kv(kv_pairs)

        hidden = inputs_embeds
        rope = self._rope(hidden, position_ids, at)  # [B, 1, T, d_D] each
        all_hidden = [hidden] if output_hidden_states else None
        for m, layer in enumerate(self.model.layers):
            kv = cross = None
            if kv_pairs is not None:
                kv = kv_pairs[m]
                cross = cross_allowed(
                    cross_attention_mask, kv[0].shape[-2], cache_position, attention_mask, b, t, first
                )
            hidden = layer(hidden, rope, self_allowed, position_ids, past_key_values, kv, cross)
            if output_hidden_states:
                all_hidden.append(hidden)
        hidden = self.model.norm(hidden)  # [B, T, H]

        if isinstance(logits_to_keep, int) and (logits_to_keep == 0 or logits_to_keep >= t):
            kept = hidden  # every position (no slicing op)
        else:
            keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
            kept = hidden[:, keep, :]
        raw = head(_like_weight(kept, head))  # [B, T', N] or [B, T', V]
        loss = None
        if labels is not None:
            if not isinstance(logits_to_keep, int):
                raise ValueError("labels need an integer logits_to_keep.")
            loss = self._loss(raw, labels[:, -raw.shape[1] :].to(raw.device), num_items_in_batch)
        logits = raw
        n = raw.shape[-1]
        v = self.config.vocab_size if full_vocab else n
        if n != v:
            logits = raw.new_full((*raw.shape[:-1], v), torch.finfo(raw.dtype).min)
            logits.index_copy_(-1, self.vocab_subset.to(raw.device), raw)  # [B, T', V]
        cache = past_key_values if use_cache else None
        hidden_states = tuple(all_hidden) if output_hidden_states else None
        if return_dict is False:  # no output object to build (a drafting loop's forwards)
            return tuple(v for v in (loss, logits, cache, hidden_states) if v is not None)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{_OUTPUT_CACHE: cache}, hidden_states=hidden_states)

    def _positions(self, at: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``cache_position`` ``[1]`` and ``position_ids`` ``[1, 1]`` of one query at sequence index ``at`` on
        ``device``, made once (read-only: nothing writes into them); apart under ``torch.inference_mode`` (its
        tensors may not
        enter a computation autograd records), as :meth:`_rope`'s tables."""
        key = (at, device, torch.is_inference_mode_enabled())
        made = self._at.get(key)
        if made is None:
            if len(self._at) >= 16384:  # positions of long generations: start over
                self._at.clear()
            position = torch.arange(at, at + 1, device=device)
            made = self._at[key] = (position, position[None])
        return made

    def _rope(self, hidden: torch.Tensor, position_ids: torch.Tensor, at: int | None) -> tuple:
        """The self-attention's ``rope_tables`` at ``position_ids``; for one query at the host position ``at``,
        where the rotary embedding does not change with the sequence length, made once per position, device, dtype
        and inference mode (the same computation on the same input: the same values; tables made under
        ``torch.inference_mode`` may not enter a computation autograd records)."""
        if at is None or self._rope_at is None:
            return rope_tables(*self.model.rotary_emb(hidden, position_ids))
        key = (at, hidden.device, hidden.dtype, torch.is_inference_mode_enabled())
        tables = self._rope_at.get(key)
        if tables is None:
            if len(self._rope_at) >= 16384:  # positions of long generations: start over
                self._rope_at.clear()
            tables = self._rope_at[key] = rope_tables(*self.model.rotary_emb(hidden, position_ids))
        return tables

    def _loss(self, raw, labels, num_items_in_batch=None):
        n = raw.shape[-1]
        targets = self.to_draft_ids(labels[:, 1:].clamp_min(0)).to(raw.device)  # [B, T'-1]
        targets = targets.masked_fill((labels[:, 1:] < 0) | (targets >= n), -100)
        reduction = "sum" if num_items_in_batch is not None else "mean"
        loss = F.cross_entropy(
            raw[:, :-1].float().reshape(-1, n), targets.reshape(-1), ignore_index=-100, reduction=reduction
        )
        return loss / num_items_in_batch if num_items_in_batch is not None else loss
