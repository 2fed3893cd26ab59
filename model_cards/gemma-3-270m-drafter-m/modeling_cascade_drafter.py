"""The hf_cascade "vanilla" drafter: a small Llama-style causal LM over a reduced vocabulary.

Remote-code ready: imports only torch, transformers and its own configuration file, so a checkpoint
saved with ``save_pretrained`` loads with ``AutoModelForCausalLM.from_pretrained(path,
trust_remote_code=True)`` without hf_cascade installed.

The drafter predicts over ``N`` target token ids only (``vocab_subset``, e.g. the most frequent ones),
as in FR-Spec (Zhao et al., 2025, "FR-Spec: Accelerating Large-Vocabulary Language Models via
Frequency-Ranked Speculative Sampling"): for a 262144-token target the output head, usually the bulk
of a small drafter's cost, shrinks ``V / N`` times. Externally it is a causal LM over the target's
full vocabulary: it reads target ids and, by default, returns ``[B, T, V]`` logits that are
``finfo.min`` outside the subset, so transformers' assisted generation and hf_cascade use it as is.
"""

import inspect

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, LlamaConfig, LlamaModel, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_cascade_drafter import CascadeDrafterConfig

# transformers 4.x's LlamaModel takes ``cache_position``; 5.x derives positions from the cache.
_BACKBONE_TAKES_CACHE_POSITION = "cache_position" in inspect.signature(LlamaModel.forward).parameters
# transformers 5.24 renamed the cache's keyword and output field past_key_values -> cache (the old name warns)
_BACKBONE_CACHE = "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"
_OUTPUT_CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def backbone_config(config: CascadeDrafterConfig) -> LlamaConfig:
    """The Llama config of the backbone: vocabulary ``N + 1`` (row ``N`` = "token outside the subset")."""
    return LlamaConfig(
        vocab_size=config.draft_vocab_size + 1,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        rope_theta=config.rope_theta,  # both 4.x (attribute) and 5.x (-> rope_parameters) accept it
        rms_norm_eps=config.rms_norm_eps,
        hidden_act=config.hidden_act,
        initializer_range=config.initializer_range,
        tie_word_embeddings=False,  # the head lives in CascadeDrafterForCausalLM
        pad_token_id=None,  # ids are remapped; no embedding row is special
        bos_token_id=None,
        eos_token_id=None,
        attn_implementation=getattr(config, "_attn_implementation", None),
    )


class CascadeDrafterForCausalLM(PreTrainedModel, GenerationMixin):
    """Llama backbone over ``N + 1`` draft ids + reduced head; target ids in, target-vocabulary logits out.

    Buffers: ``vocab_subset`` ``[N]`` (sorted target ids; draft id ``i`` is target id ``vocab_subset[i]``).
    """

    config_class = CascadeDrafterConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["LlamaDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values", "cache"]
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}  # 4.x iterates the keys
    _supports_cache_class = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True

    def __init__(self, config: CascadeDrafterConfig):
        super().__init__(config)
        n = config.draft_vocab_size
        self.model = LlamaModel(backbone_config(config))
        self.lm_head = nn.Linear(config.hidden_size, n + 1, bias=False)  # column N (OOV) is always masked
        self.register_buffer("vocab_subset", torch.arange(n, dtype=torch.long), persistent=True)  # [N]
        self.post_init()

    # -- vocabulary ----------------------------------------------------------------------------
    @property
    def draft_vocab_size(self) -> int:
        return self.config.draft_vocab_size

    @torch.no_grad()
    def set_vocab_subset(self, ids) -> None:
        """Set the ``N`` target ids the drafter predicts (sorted, unique, in ``[0, vocab_size)``)."""
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
        """Target ids (any shape) -> draft ids in ``[0, N]``; ids outside the subset map to ``N``."""
        subset = self.vocab_subset
        ids = input_ids.to(subset.device)
        pos = torch.searchsorted(subset, ids.contiguous()).clamp_max(subset.numel() - 1)
        return torch.where(subset[pos] == ids, pos, torch.full_like(pos, subset.numel()))

    def get_input_embeddings(self) -> nn.Embedding:
        """The backbone's ``[N + 1, H]`` embedding (indexed by draft ids, not target ids)."""
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    # -- forward -------------------------------------------------------------------------------
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
        full_vocab: bool = True,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """``input_ids`` ``[B, T]`` are TARGET ids; ``labels`` ``[B, T]`` too (shifted inside; -100 and
        ids outside the subset are ignored; the loss is cross-entropy over the reduced vocabulary).

        Returns logits ``[B, T', V]`` (``full_vocab=True``, ``finfo.min`` outside the subset) or
        ``[B, T', N]`` (``full_vocab=False``), ``T'`` = the positions kept by ``logits_to_keep``."""
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        past_key_values = kwargs.pop("cache", past_key_values)  # transformers >= 5.24's generate passes ``cache``
        cache_position = kwargs.pop("cache_position", None)  # transformers 4.x's generate passes it
        if cache_position is not None and _BACKBONE_TAKES_CACHE_POSITION:
            kwargs["cache_position"] = cache_position
        outputs = self.model(
            input_ids=self.to_draft_ids(input_ids) if input_ids is not None else None,  # [B, T] in [0, N]
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **{_BACKBONE_CACHE: past_key_values},
            **kwargs,
        )
        hidden = outputs.last_hidden_state  # [B, T, H]
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        n = self.config.draft_vocab_size
        reduced = self.lm_head(hidden[:, keep, :])[..., :n]  # [B, T', N]

        loss = None
        if labels is not None:
            if not isinstance(logits_to_keep, int):
                raise ValueError("labels need an integer logits_to_keep.")
            labels = labels[:, -reduced.shape[1] :].to(reduced.device)  # [B, T']
            targets = self.to_draft_ids(labels[:, 1:].clamp_min(0)).to(reduced.device)  # [B, T'-1]
            targets = targets.masked_fill((labels[:, 1:] < 0) | (targets == n), -100)
            logp = reduced[:, :-1, :].float().reshape(-1, n)
            reduction = "sum" if num_items_in_batch is not None else "mean"
            loss = F.cross_entropy(logp, targets.reshape(-1), ignore_index=-100, reduction=reduction)
            if num_items_in_batch is not None:
                loss = loss / num_items_in_batch

        logits = reduced
        if full_vocab:
            b, t, _ = reduced.shape
            logits = reduced.new_full((b, t, self.config.vocab_size), torch.finfo(reduced.dtype).min)
            logits.index_copy_(-1, self.vocab_subset.to(reduced.device), reduced)  # [B, T', V]
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            **{_OUTPUT_CACHE: getattr(outputs, _OUTPUT_CACHE)},
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
