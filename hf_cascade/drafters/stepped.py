"""A Llama decoder's cached forward stepped through its own modules, for a drafter's per-token forwards.

transformers' ``LlamaModel.forward`` runs, around its layers, a fixed amount of Python per call whatever the input:
its decorators (deprecated keywords, config defaults, output capture), a fresh ``ModuleList`` for
``layers[:num_hidden_layers]`` and an output object. For a drafter that forwards one token at a time that fixed
work is a large share of the forward. :class:`SteppedDecoder` runs the same computation through the same modules
and functions, in the same order and with the same arguments (embedding, position ids from the cache's length,
``create_causal_mask``, the rotary embedding, each decoder layer, the final norm), so its hidden states are the
decoder's, bit for bit, and the cache is updated alike. For one query (a drafter's next token) at a host position
it makes the position ids and rotary tables once per position (where the rotary embedding does not change with the
sequence length: not "dynamic" / "longrope"), and, where ``create_causal_mask`` gave no mask for one query over
the same kind of cache and attention (sdpa without a sliding window: a single query sees every cached key), asks
it no more: the same values as computing them again.

The rule: it runs only a decoder whose class uses transformers' own ``LlamaModel.forward`` (and layers their own
``LlamaDecoderLayer.forward``) of the signature it was written against, not training, and not traced; and only
while nothing observes or wraps the decoder's call (no forward hooks or pre-hooks on it, none global, no instance
``forward`` such as accelerate's hooks install): a hook on the decoder expects to see each forward, so then the
decoder itself runs. Anything else: :meth:`SteppedDecoder.of` gives
``None`` and the caller runs the decoder.
"""

from __future__ import annotations

import inspect

import torch
from torch.nn.modules import module as _module

try:  # the transformers this was written against (5.x, ``cache=``)
    from transformers.masking_utils import create_causal_mask
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaModel
except ImportError:  # pragma: no cover - other transformers versions
    LlamaModel = LlamaDecoderLayer = create_causal_mask = None

_MODEL_PARAMS = ("self", "input_ids", "attention_mask", "position_ids", "cache", "inputs_embeds", "use_cache", "kwargs")
_LAYER_PARAMS = (
    "self",
    "hidden_states",
    "attention_mask",
    "position_ids",
    "cache",
    "use_cache",
    "position_embeddings",
    "kwargs",
)


def _known() -> bool:
    """Whether the installed ``LlamaModel.forward`` and ``LlamaDecoderLayer.forward`` take the arguments this
    module passes (their signatures as written against)."""
    if LlamaModel is None:
        return False
    try:
        return (
            tuple(inspect.signature(LlamaModel.forward).parameters) == _MODEL_PARAMS
            and tuple(inspect.signature(LlamaDecoderLayer.forward).parameters) == _LAYER_PARAMS
        )
    except (TypeError, ValueError):  # pragma: no cover - a signature inspect cannot read
        return False


_KNOWN = _known()


class SteppedDecoder:
    """``decoder``'s cached forward over ``input_ids`` stepped through its modules (see the module docstring).
    Made by :meth:`of`; call :meth:`usable` before each forward."""

    def __init__(self, decoder, layers: list):
        self.decoder, self.layers = decoder, layers
        rope_type = getattr(decoder.rotary_emb, "rope_type", "default")
        self._one: dict | None = {} if rope_type not in ("dynamic", "longrope") else None  # one query's inputs
        config = decoder.config
        # where one query gets no mask whatever the cache's length (sdpa, no sliding window): whether it got none
        self._maskless = (
            getattr(config, "_attn_implementation", None) == "sdpa" and getattr(config, "sliding_window", None) is None
        )
        self._no_mask: set = set()  # cache classes for which one query got no mask

    @classmethod
    def of(cls, decoder) -> SteppedDecoder | None:
        """The stepped forward of ``decoder``, or ``None`` where it is not a decoder this module reproduces."""
        if not _KNOWN or decoder is None or type(decoder).forward is not LlamaModel.forward:
            return None
        layers = list(decoder.layers)[: decoder.config.num_hidden_layers]
        if any(type(layer).forward is not LlamaDecoderLayer.forward for layer in layers):
            return None
        return cls(decoder, layers)

    def usable(self) -> bool:
        """Whether this forward may be stepped: nothing observes or wraps the decoder's call (torch hooks, global or
        its own; an instance ``forward`` such as accelerate's hook installs), not training, not traced."""
        d = self.decoder
        return not (
            d._forward_hooks
            or d._forward_pre_hooks
            or _module._global_forward_hooks
            or _module._global_forward_pre_hooks
            or "forward" in d.__dict__
            or d.training
            or torch._C._get_tracing_state()
        )

    def __call__(self, input_ids: torch.Tensor, cache) -> torch.Tensor:
        """The decoder's ``last_hidden_state`` ``[B, T, H]`` of ``input_ids`` ``[B, T]`` after ``cache`` (a
        ``Cache``, updated in place), as ``decoder(input_ids=input_ids, cache=cache, use_cache=True)`` gives it."""
        d = self.decoder
        embeds = d.embed_tokens(input_ids)
        past = cache.get_seq_length()
        one = embeds.shape[1] == 1 and self._one is not None
        if one:
            position_ids, position_embeddings = self._one_query(embeds, past)
        else:
            position_ids = (torch.arange(embeds.shape[1], device=embeds.device) + past).unsqueeze(0)
        if one and type(cache) in self._no_mask:
            mask = None
        else:
            mask = create_causal_mask(
                config=d.config, inputs_embeds=embeds, attention_mask=None, cache=cache, position_ids=position_ids
            )
            if one and mask is None and self._maskless:
                self._no_mask.add(type(cache))
        if not one:
            position_embeddings = d.rotary_emb(embeds, position_ids=position_ids)
        hidden = embeds
        for layer in self.layers:
            hidden = layer(
                hidden,
                attention_mask=mask,
                position_embeddings=position_embeddings,
                position_ids=position_ids,
                cache=cache,
                use_cache=True,
            )
        return d.norm(hidden)

    def _one_query(self, embeds: torch.Tensor, past: int) -> tuple:
        """``(position_ids [1, 1], rotary tables)`` of one query at sequence index ``past``, made once per position,
        device, dtype and inference mode (tensors made under ``torch.inference_mode`` may not enter a computation
        autograd records; read-only: nothing writes into them)."""
        key = (past, embeds.device, embeds.dtype, torch.is_inference_mode_enabled())
        made = self._one.get(key)
        if made is None:
            if len(self._one) >= 16384:  # positions of long generations: start over
                self._one.clear()
            position_ids = (torch.arange(1, device=embeds.device) + past).unsqueeze(0)
            made = self._one[key] = (position_ids, self.decoder.rotary_emb(embeds, position_ids=position_ids))
        return made


__all__ = ["SteppedDecoder"]
