"""A Llama decoder's cached forward stepped through its own modules, for a drafter's per-token forwards.

transformers' ``LlamaModel.forward`` runs, around its layers, a fixed amount of Python per call whatever the input:
its decorators (deprecated keywords, config defaults, output capture), a fresh ``ModuleList`` for
``layers[:num_hidden_layers]`` and an output object. For a drafter that forwards one token at a time that fixed
work is a large share of the forward. :class:`SteppedDecoder` runs the same computation through the same modules
and functions, in the same order and with the same arguments (embedding, position ids from the cache's length,
``create_causal_mask``, the rotary embedding, each decoder layer, the final norm), so its hidden states are the
decoder's, bit for bit, and the cache is updated alike.

The rule: it runs only a decoder whose class uses transformers' own ``LlamaModel.forward`` (and layers their own
``LlamaDecoderLayer.forward``) of the signature it was written against, not training, and not traced; and only
while nothing observes the decoder's call (no forward hooks or pre-hooks on it, none global): a hook on the decoder
expects to see each forward, so then the decoder itself runs. Anything else: :meth:`SteppedDecoder.of` gives
``None`` and the caller runs the decoder.
"""

from __future__ import annotations

import inspect

import torch
from torch.nn.modules import module as _module

try:                                              # the transformers this was written against (5.x, ``cache=``)
    from transformers.masking_utils import create_causal_mask
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaModel
except ImportError:                               # pragma: no cover - other transformers versions
    LlamaModel = LlamaDecoderLayer = create_causal_mask = None

_MODEL_PARAMS = ("self", "input_ids", "attention_mask", "position_ids", "cache", "inputs_embeds", "use_cache", "kwargs")
_LAYER_PARAMS = ("self", "hidden_states", "attention_mask", "position_ids", "cache", "use_cache", "position_embeddings",
                 "kwargs")


def _known() -> bool:
    """Whether the installed ``LlamaModel.forward`` and ``LlamaDecoderLayer.forward`` take the arguments this
    module passes (their signatures as written against)."""
    if LlamaModel is None:
        return False
    try:
        return (tuple(inspect.signature(LlamaModel.forward).parameters) == _MODEL_PARAMS
                and tuple(inspect.signature(LlamaDecoderLayer.forward).parameters) == _LAYER_PARAMS)
    except (TypeError, ValueError):              # pragma: no cover - a signature inspect cannot read
        return False


_KNOWN = _known()


class SteppedDecoder:
    """``decoder``'s cached forward over ``input_ids`` stepped through its modules (see the module docstring).
    Made by :meth:`of`; call :meth:`usable` before each forward."""

    def __init__(self, decoder, layers: list):
        self.decoder, self.layers = decoder, layers

    @classmethod
    def of(cls, decoder) -> "SteppedDecoder | None":
        """The stepped forward of ``decoder``, or ``None`` where it is not a decoder this module reproduces."""
        if not _KNOWN or decoder is None or type(decoder).forward is not LlamaModel.forward:
            return None
        layers = list(decoder.layers)[: decoder.config.num_hidden_layers]
        if any(type(layer).forward is not LlamaDecoderLayer.forward for layer in layers):
            return None
        return cls(decoder, layers)

    def usable(self) -> bool:
        """Whether this forward may be stepped: nothing observes the decoder's call, not training, not traced."""
        d = self.decoder
        return not (d._forward_hooks or d._forward_pre_hooks or _module._global_forward_hooks
                    or _module._global_forward_pre_hooks or d.training or torch._C._get_tracing_state())

    def __call__(self, input_ids: torch.Tensor, cache) -> torch.Tensor:
        """The decoder's ``last_hidden_state`` ``[B, T, H]`` of ``input_ids`` ``[B, T]`` after ``cache`` (a
        ``Cache``, updated in place), as ``decoder(input_ids=input_ids, cache=cache, use_cache=True)`` gives it."""
        d = self.decoder
        embeds = d.embed_tokens(input_ids)
        past = cache.get_seq_length()
        position_ids = (torch.arange(embeds.shape[1], device=embeds.device) + past).unsqueeze(0)
        mask = create_causal_mask(config=d.config, inputs_embeds=embeds, attention_mask=None, cache=cache,
                                  position_ids=position_ids)
        position_embeddings = d.rotary_emb(embeds, position_ids=position_ids)
        hidden = embeds
        for layer in self.layers:
            hidden = layer(hidden, attention_mask=mask, position_embeddings=position_embeddings,
                           position_ids=position_ids, cache=cache, use_cache=True)
        return d.norm(hidden)


__all__ = ["SteppedDecoder"]
